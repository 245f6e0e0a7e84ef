"""The training loop: exact continuation from checkpoints, phases, extra optimisers, failures."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from augtune.config import from_dict
from augtune.data import load_dataset
from augtune.methods import AUGMENTATIONS, Augmentation, OptimizerSpec
from augtune.trainables.loop import NonFiniteLoss, Trainer, _ParametersLeftToLoad, lr_factor
from augtune.trainables.run import train_run
from conftest import TINY_CNN, needs_gpu


def digits_cfg(**sections):
    data = {
        "dataset": {"name": "digits", "max_train": 256, "max_test": 128},
        "model": dict(TINY_CNN),  # a copy: `sections` update it
        "method": {"queue_size": 128},
        "train": {"epochs": 3, "batch_size": 64, "lr": 1e-3, "warmup_epochs": 1},
        "eval": {"every": 1, "epoch_metrics": ["knn"], "metrics": ["knn"], "references": False},
    }
    for k, v in sections.items():
        data.setdefault(k, {}).update(v)
    return from_dict(data)


@pytest.fixture(scope="module")
def digits():
    return load_dataset(digits_cfg().dataset)


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.method.state_dict().items()}


@pytest.mark.parametrize("base", ["simclr", "byol", "moco", "simsiam"])
def test_stop_and_continue_from_checkpoint_is_bitwise_identical(tmp_path, digits, base):
    cfg = digits_cfg(
        method={"base": base}, train={"optimizer": "sgd", "lr": 0.05} if base == "simsiam" else {}
    )
    straight = Trainer(cfg, digits)
    straight.fit()

    first = Trainer(cfg, digits)
    first.fit(tmp_path / "ckpt.pt", stop_after=2)
    torch.manual_seed(12345)  # the process's RNG moves on; the checkpoint must restore it
    second = Trainer(cfg, digits, restoring=True)  # as a resumed trial: initial weights not drawn
    second.load_checkpoint(tmp_path / "ckpt.pt")
    assert second.epoch == 2
    second.fit(tmp_path / "ckpt.pt")

    a, b = weights(straight), weights(second)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [h["loss"] for h in straight.history] == [h["loss"] for h in second.history]


def test_lr_schedule_warms_up_then_decays():
    f = [lr_factor(s, 100, 10, 0.0, "cosine") for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))
    assert lr_factor(100, 100, 10, 0.1, "cosine") == pytest.approx(0.1)
    assert lr_factor(50, 100, 0, 0.0, "constant") == 1.0


class TwoPhaseToy(Augmentation):
    """A test-only augmentation: its own network trained by its own optimiser in phase B only."""

    name = "toy"
    encoder_phases = ("A",)

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.net = nn.Linear(4, 1)
        self.phase_log: list[str] = []

    def default_phases(self) -> str:
        return "A:1,B:1,A:1"

    def transform(self, batch, method, info):
        self.phase_log.append(info.phase)
        return batch

    def phase_loss(self, batch, method, info):
        if info.phase != "B":
            return None
        return {"toy": self.net(torch.ones(2, 4)).pow(2).mean()}

    def optimizer_specs(self):
        return [OptimizerSpec("toy", list(self.net.parameters()), lr=0.1, kind="sgd", phases=("B",))]


def test_phases_switch_optimisers_and_losses(monkeypatch, digits):
    monkeypatch.setitem(AUGMENTATIONS, "toy", TwoPhaseToy)
    cfg = digits_cfg(method={"augment": ["toy"]})
    trainer = Trainer(cfg, digits)
    toy = trainer.method.augments[0]
    enc0 = [p.clone() for p in trainer.method.objective.encoder.parameters()]
    net0 = toy.net.weight.clone()

    trainer.fit(stop_after=1)  # phase A: the encoder moves, the toy network does not
    assert torch.equal(toy.net.weight, net0)
    enc1 = [p.clone() for p in trainer.method.objective.encoder.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(enc0, enc1))

    trainer.fit(stop_after=2)  # phase B: the reverse
    assert not torch.equal(toy.net.weight, net0)
    assert all(torch.equal(a, b) for a, b in zip(enc1, trainer.method.objective.encoder.parameters()))
    assert [h["phase"] for h in trainer.history] == ["A", "B"]
    assert "loss_toy" in trainer.history[1]
    assert set(toy.phase_log) == {"A", "B"}


def test_unknown_phase_name_is_refused(monkeypatch, digits):
    monkeypatch.setitem(AUGMENTATIONS, "toy", TwoPhaseToy)
    with pytest.raises(ValueError, match=r"train.phases: .*\['C'\]"):
        Trainer(digits_cfg(method={"augment": ["toy"]}, train={"phases": "A:1,C:1"}), digits)


class NaNAfterFiveSteps(Augmentation):
    """A loss term that becomes NaN at the sixth step (a diverged run, made on purpose)."""

    name = "nan_after_five"

    def loss_terms(self, batch, out, method, info):
        return {"bad": torch.tensor(float("nan") if info.step >= 5 else 0.0)}


def test_nan_loss_stops_the_run_and_the_record_says_why(tmp_path, digits, monkeypatch):
    monkeypatch.setitem(AUGMENTATIONS, "nan_after_five", NaNAfterFiveSteps)
    cfg = digits_cfg(method={"augment": ["nan_after_five"]})
    with pytest.raises(NonFiniteLoss, match=r"at epoch 2, step 2 \(global step 6\)"):
        train_run(cfg, digits, tmp_path / "run", log=lambda s: None)
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert record["status"] == "failed" and "epoch" in record["error"]


class NaNAtTheLastStep(Augmentation):
    """A loss term that becomes NaN at the last step of the first epoch (4 steps of 64 of 256)."""

    name = "nan_at_the_last_step"

    def loss_terms(self, batch, out, method, info):
        return {"bad": torch.tensor(float("nan") if info.step == 3 else 0.0)}


def test_a_nan_loss_in_an_epoch_s_last_step_is_caught_before_the_epoch_ends(digits, monkeypatch):
    """The loop checks a step's loss one step late (no device sync per forward); the last step's is
    checked before the epoch reports anything."""
    monkeypatch.setitem(AUGMENTATIONS, "nan_at_the_last_step", NaNAtTheLastStep)
    trainer = Trainer(digits_cfg(method={"augment": ["nan_at_the_last_step"]}), digits)
    with pytest.raises(NonFiniteLoss, match=r"at epoch 1, step 4 \(global step 4\)"):
        trainer.fit()
    assert trainer.history == [] and trainer.epoch == 0


def test_record_holds_provenance_and_per_epoch_metrics(tmp_path, digits):
    cfg = digits_cfg(eval={"references": True, "metrics": ["knn", "kmeans"]})
    lines: list[str] = []
    record = train_run(cfg, digits, tmp_path / "run", log=lines.append)
    assert record["status"] == "completed" and record["method"] == "simclr" and record["dataset"] == "digits"
    assert record["config"]["train"]["epochs"] == 3 and record["seed"] == 0
    assert record["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert "git_revision" in record and record["versions"]["python"]
    assert [e["epoch"] for e in record["epochs"]] == [1, 2, 3]
    assert all("knn_acc" in e and "epoch_time_s" in e and "samples_per_s" in e for e in record["epochs"])
    assert set(record["final"]) == {"knn_acc", "kmeans_acc", "kmeans_nmi", "kmeans_ari"}
    assert set(record["references"]) == {"raw", "random-init"}
    assert (tmp_path / "run" / "config.yaml").is_file() and (tmp_path / "run" / "checkpoint.pt").is_file()
    assert len(lines) == 3 and lines[0].startswith("epoch 1/3")


@pytest.mark.parametrize(("backbone", "augment"), [("resnet18", "none")] + [
    ("cnn", a) for a in ("none", "pinda", "nrcc", "cocor", "diffaug")])
def test_a_restoring_trainer_leaves_only_parameters_undrawn_and_a_load_makes_it_the_same_run(
        tmp_path, digits, backbone, augment):
    """`restoring=True` (a resumed or PBT-exploited trial) skips the initial fills of parameters only:
    they differ before the load, every buffer the checkpoint does not hold is drawn as usual, and after
    the load the two trainers hold the same state and train the same next epoch (on vectors, every
    method and base: tests/test_pbt.py's exploit test, through the trial's own path)."""
    model = TINY_CNN if backbone == "cnn" else {**TINY_CNN, "backbone": "resnet18", "width": 4}
    cfg = digits_cfg(model=model, method={"base": "moco", "augment": [] if augment == "none" else [augment]},
                     train={"epochs": 2}, cocor={"label_fraction": 0.2, "meta_batch": 16},
                     diffaug={"steps": 20, "sample_steps": 5, "gen_hidden": 32})
    fills = []

    class Spy(torch.overrides.TorchFunctionMode):  # sees what the restoring mode lets through
        def __torch_function__(self, func, types, args=(), kwargs=None):
            target = args[0] if args else (kwargs or {}).get("tensor")
            if func in _ParametersLeftToLoad.FILLS and isinstance(target, nn.Parameter):
                fills.append(func)
            return func(*args, **(kwargs or {}))

    with Spy():
        fresh = Trainer(cfg, digits)
        drawn, fills[:] = len(fills), []
        restored = Trainer(cfg, digits, restoring=True)
    assert drawn > 0 and fills == []  # a fresh build fills its parameters; a restoring one fills none
    unsaved = [k for k, _ in fresh.method.named_buffers() if k not in fresh.method.state_dict()]
    buffers = dict(restored.method.named_buffers())
    assert all(torch.equal(b, buffers[k]) for k, b in fresh.method.named_buffers() if k in unsaved), unsaved
    fresh.save_checkpoint(tmp_path / "c.pt")
    a = weights(fresh)
    loss = fresh.train_epoch()["loss"] if augment in ("none", "pinda") else None  # the others: seconds
    restored.load_checkpoint(tmp_path / "c.pt")  # the process's RNG as it was at the save, too
    b = weights(restored)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert loss is None or restored.train_epoch()["loss"] == loss


def test_checkpoint_loads_with_weights_only(tmp_path, digits):
    trainer = Trainer(digits_cfg(method={"base": "moco"}), digits)
    trainer.fit(tmp_path / "c.pt", stop_after=1)
    state = torch.load(tmp_path / "c.pt", weights_only=True)
    assert {"method", "optimizers", "rng_cpu", "epoch", "history"} <= set(state)
    assert "objective.queue" in state["method"]  # MoCo's queue travels with the weights


def test_references_are_computed_once_and_reused_with_identical_numbers(tmp_path, digits, monkeypatch):
    cache = tmp_path / "refs"
    cfg = digits_cfg(eval={"references": True, "reference_cache": str(cache), "metrics": ["knn", "kmeans"]})
    first = Trainer(cfg, digits)
    refs = first.evaluate_references()
    assert sorted(p.name.split("-")[0] for p in cache.glob("*.json")) == ["random", "raw"]
    calls = []
    real = Trainer.evaluate
    monkeypatch.setattr(Trainer, "evaluate", lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
    again = Trainer(cfg, digits).evaluate_references()  # a second trial with the same inputs
    assert calls == [] and again == refs
    other_seed = Trainer(digits_cfg(eval={"references": True, "reference_cache": str(cache),
                                          "metrics": ["knn", "kmeans"]}, train={"seed": 7}), digits)
    other = other_seed.evaluate_references()
    assert len(calls) == 1  # random-init depends on the seed; raw does not
    assert other["raw"] == refs["raw"]


def _slow_reference(kind: str, log: str) -> dict:
    import time

    with open(log, "a") as f:
        f.write(f"{kind}\n")
    time.sleep(1.0)  # long enough that the other process asks while this one computes
    return {"knn_acc": 0.5 if kind == "raw" else 0.25}


def _references_in_a_process(cache: str, log: str, out: str) -> None:
    import functools
    import json

    from augtune.trainables.references import cached

    cfg = digits_cfg(eval={"references": True, "reference_cache": cache})
    got = cached(cfg, {kind: functools.partial(_slow_reference, kind, log)
                       for kind in ("raw", "random-init")})
    with open(out, "w") as f:
        json.dump(got, f)


def test_trials_that_start_together_compute_each_reference_once(tmp_path):
    """Two trial processes with the same inputs and an empty cache: each reference row is computed by one
    of them (the other computes the other row meanwhile, or waits), and both report the same numbers."""
    import json
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    log = tmp_path / "computed.txt"
    procs = [ctx.Process(target=_references_in_a_process, args=(str(tmp_path / "refs"), str(log),
                                                                  str(tmp_path / f"out{i}.json")))
             for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert sorted(log.read_text().split()) == ["random-init", "raw"]  # each once, not once per process
    outs = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2)]
    assert outs[0] == outs[1] == {"raw": {"knn_acc": 0.5}, "random-init": {"knn_acc": 0.25}}


def test_epoch_metrics_only_where_read(digits):
    cfg = digits_cfg(train={"epochs": 5}, eval={"every": 0, "at": [2, 3]})
    trainer = Trainer(cfg, digits)
    trainer.fit()
    assert [("knn_acc" in h) for h in trainer.history] == [False, True, True, False, True]  # the last: final


def test_a_search_trial_with_the_default_eval_settings_evaluates_only_at_the_rungs(digits, tmp_path):
    """eval.every left at its default: `augtune train` evaluates every epoch, a search's trial only where
    ASHA reads its metric (rungs 1, 2, 4 of 6 epochs with grace 1, factor 2) and at the end."""
    from augtune.config import to_dict
    from augtune.search.plan import trial_base

    data = to_dict(digits_cfg(train={"epochs": 6}, search={"scheduler": "asha", "grace_period": 1,
                                                         "reduction_factor": 2, "metric": "knn_acc"}))
    data["eval"].pop("every")
    alone = Trainer(from_dict(data), digits)
    alone.fit()
    assert all("knn_acc" in h for h in alone.history)
    trial = Trainer(from_dict(trial_base(from_dict(data), str(tmp_path))), digits)
    trial.fit()
    assert [h["epoch"] for h in trial.history if "knn_acc" in h] == [1, 2, 4, 6]


def test_monitoring_uses_a_fixed_subsample_and_the_end_all_samples(digits):
    cfg = digits_cfg(train={"epochs": 2}, eval={"every": 1, "monitor_size": 50})
    trainer = Trainer(cfg, digits)
    seen = []
    real = trainer.evaluate

    def spy(metrics, fn=None, monitor=False, seed=None):
        seen.append(monitor)
        return real(metrics, fn, monitor, seed)

    trainer.evaluate = spy
    trainer.fit()
    assert seen == [True, False]
    a, b = trainer._monitor_index(200, "test"), trainer._monitor_index(200, "test")
    assert torch.equal(a, b) and len(a) == 50 and trainer._monitor_index(40, "test") is None


def test_checkpoint_every_takes_epochs_or_a_duration():
    from augtune.config import ConfigError
    from augtune.trainables.loop import checkpoint_due

    assert [checkpoint_due(e, 6, 2) for e in range(1, 7)] == [False, True, False, True, False, True]
    assert [checkpoint_due(e, 6, 0) for e in range(1, 7)] == [False] * 5 + [True]
    assert checkpoint_due(3, 6, "5min", since_last_s=299) is False
    assert checkpoint_due(3, 6, "5min", since_last_s=300) is True
    assert checkpoint_due(6, 6, "1h", since_last_s=0) is True  # the last epoch always
    assert checkpoint_due(3, 6, None, default="30s", since_last_s=31) is True
    assert digits_cfg(train={"checkpoint_every": "1.5h"}).train.checkpoint_every == "1.5h"
    with pytest.raises(
        ConfigError, match="train.checkpoint_every: expected a number of epochs or a duration"
    ):
        digits_cfg(train={"checkpoint_every": "soon"})


def read_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """Scalars of the TensorBoard event files in `folder`, read with tensorboardX's own protobufs
    (TFRecord framing: length, its CRC, the Event, its CRC)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents*")):
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def test_train_writes_tensorboard_scalars_into_its_run_folder(tmp_path, digits):
    record = train_run(digits_cfg(), digits, tmp_path / "run", log=lambda s: None)
    scalars = read_scalars(tmp_path / "run")
    assert [step for step, _ in scalars["loss"]] == [1, 2, 3]
    assert [v for _, v in scalars["loss"]] == pytest.approx([e["loss"] for e in record["epochs"]])
    assert "knn_acc" in scalars and "epoch_time_s" in scalars


def test_channels_last_trains_the_same_numbers(digits):
    """A GPU switch, checked for correctness on the CPU: NHWC memory order changes no result beyond
    float rounding."""
    plain = Trainer(digits_cfg(train={"epochs": 2}), digits)
    plain.fit()
    nhwc = Trainer(digits_cfg(train={"epochs": 2, "channels_last": True}), digits)
    nhwc.fit()
    assert [h["loss"] for h in nhwc.history] == pytest.approx([h["loss"] for h in plain.history], rel=1e-4)


@pytest.mark.parametrize("switch,kwargs", [(True, {}), ("reduce-overhead", {"mode": "reduce-overhead"})])
def test_train_compile_compiles_the_backbone_alone_in_the_mode_asked(monkeypatch, digits, switch, kwargs):
    calls = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **k: calls.append((self, k)))
    trainer = Trainer(digits_cfg(train={"epochs": 1, "compile": switch}), digits)
    assert calls == [(trainer.method.objective.encoder.backbone, kwargs)]


def test_cuda_graphs_open_a_generation_each_step_and_copy_the_encoders_outputs(monkeypatch, digits):
    """Under `train.compile: reduce-overhead` on a GPU a graph's replay rewrites its outputs in place:
    every step starts a new generation, and the encoder hands out copies (CoCor and NRCC call it
    again while holding an earlier output). On the CPU there are no graphs and nothing is copied."""
    trainer = Trainer(digits_cfg(train={"epochs": 2, "device": "cpu"}), digits)
    encoder = trainer.method.objective.encoder
    assert not trainer.graphs and not encoder.clone_outputs
    backbone_out = []
    encoder.backbone.register_forward_hook(lambda m, i, o: backbone_out.append(o))
    x = torch.rand(4, *digits.shape)
    assert encoder(x) is backbone_out[-1]
    encoder.clone_outputs = True  # as the loop sets it on a GPU
    out = encoder(x)
    assert out is not backbone_out[-1] and torch.equal(out, backbone_out[-1])
    assert out.data_ptr() != backbone_out[-1].data_ptr()
    marks = []
    mark = lambda: marks.append(trainer.global_step)  # noqa: E731
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", mark)
    trainer.train_epoch()
    assert marks == []  # off on the CPU
    trainer.graphs = True
    trainer.train_epoch()
    assert marks == list(range(trainer.steps_per_epoch, 2 * trainer.steps_per_epoch))  # once before each step


@needs_gpu
@pytest.mark.parametrize("augment", ["none", "pinda", "cocor", "nrcc", "diffaug"])
def test_cuda_graphs_train_every_method_as_eager_does_on_the_gpu(digits, augment):
    """`train.compile: reduce-overhead` with every augmentation (CoCor and NRCC call the backbone
    several times a step; DiffAug also under no_grad at its refresh): it runs, and its losses are
    eager's up to inductor's rounding."""
    sections = {"method": {"augment": [] if augment == "none" else [augment]}}
    if augment == "diffaug":
        sections["diffaug"] = {"schedule": "B:1,A:1", "gen_steps": 1}
    losses = {}
    for switch in (False, "reduce-overhead"):
        train = {"epochs": 2, "device": "cuda", "precision": "bf16", "compile": switch}
        trainer = Trainer(digits_cfg(**sections, train=train), digits)
        trainer.fit()
        losses[switch] = [h["loss"] for h in trainer.history]
        torch.compiler.reset()
    assert losses["reduce-overhead"] == pytest.approx(losses[False], rel=2e-2)


@pytest.mark.slow
def test_compiled_backbone_trains_the_same_numbers_and_keeps_checkpoint_keys(tmp_path, digits):
    plain = Trainer(digits_cfg(train={"epochs": 1}), digits)
    plain.fit()
    compiled = Trainer(digits_cfg(train={"epochs": 1, "compile": True}), digits)
    compiled.fit(tmp_path / "c.pt")
    assert compiled.history[0]["loss"] == pytest.approx(plain.history[0]["loss"], rel=1e-4)
    state = torch.load(tmp_path / "c.pt", weights_only=True)["method"]
    assert state.keys() == plain.method.state_dict().keys()  # no _orig_mod. prefix
