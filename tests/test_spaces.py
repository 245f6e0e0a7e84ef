"""Search spaces: the inline grammar, the registered spaces as data, and what Tune/Optuna get from them.

No Ray runtime: Tune domains, Tune's variant generator and OptunaSearch are plain Python objects.
"""
from __future__ import annotations

import math

import optuna
import pytest
import yaml
from optuna.samplers import RandomSampler, TPESampler
from ray import tune
from ray.tune.search.optuna import OptunaSearch
from ray.tune.search.sample import Categorical, Float, Integer, LogUniform, Quantized, Uniform
from ray.tune.search.variant_generator import generate_variants

from augtune.config import ConfigError, SearchConfig, dotted_keys, from_dict, set_values
from augtune.search.searchers import check_algorithm, grid_params, sample_values, to_optuna_search_kwargs
from augtune.spaces import SPACES, Space, check_keys, constants, parse_domain, resolve_space, searched

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _samples(domain, n=40):
    return [sample_values(Space("t", {"k": domain}), seed)["k"] for seed in range(n)]


# ---------------------------------------------------------------------------------------------
# The grammar

@pytest.mark.parametrize("spec,cls,sampler,lower,upper", [
    ("loguniform(1e-4, 1e-1)", Float, LogUniform, 1e-4, 0.1),
    ("uniform(0.05, 1.0)", Float, Uniform, 0.05, 1.0),
    ("  uniform( -1 , 1 ) ", Float, Uniform, -1, 1),
    ("randint(2, 5)", Integer, Uniform, 2, 5),
    ("lograndint(64, 2049)", Integer, LogUniform, 64, 2049),
])
def test_numeric_forms_give_the_tune_domain_with_its_bounds_and_sample_inside(
    spec, cls, sampler, lower, upper
):
    domain = parse_domain("train.lr", spec)
    assert isinstance(domain, cls) and isinstance(domain.get_sampler(), sampler)
    assert (domain.lower, domain.upper) == (lower, upper)
    for x in _samples(domain):
        assert isinstance(x, float if cls is Float else int)
        assert lower <= x <= upper if cls is Float else lower <= x < upper  # randint: b exclusive


def test_quniform_samples_multiples_of_q_with_b_inclusive():
    domain = parse_domain("train.warmup_epochs", "quniform(0, 10, 2)")
    assert isinstance(domain, Float) and isinstance(domain.sampler, Quantized) and domain.sampler.q == 2
    xs = _samples(domain, 80)
    assert set(xs) <= {0, 2, 4, 6, 8, 10} and 10 in xs


@pytest.mark.parametrize("spec,values", [
    ("choice([simclr, byol])", ["simclr", "byol"]),
    ("choice([1e-4, 1e-3])", [1e-4, 1e-3]),  # exponent numbers are numbers, not PyYAML strings
    ([64, 128], [64, 128]),  # a bare YAML list is a choice
    ((64, 128), [64, 128]),  # ... also once the config froze it to a tuple
    ("choice([[pinda], []])", [["pinda"], []]),  # list-valued values (method.augment)
])
def test_choices(spec, values):
    domain = parse_domain("method.base", spec)
    assert isinstance(domain, Categorical) and list(domain.categories) == values
    assert all(x in values for x in _samples(domain, 10))


def test_grid_and_constants():
    assert parse_domain("train.batch_size", "grid([128, 256])") == tune.grid_search([128, 256])
    assert parse_domain("train.batch_size", {"grid_search": (128, 256)}) == tune.grid_search([128, 256])
    for spec, value in [(50, 50), ("cosine", "cosine"), ("1e-3", 1e-3), (True, True), (None, None),
                        ("A:2,B:4", "A:2,B:4")]:
        assert parse_domain("train.x", spec) == value
    domain = tune.loguniform(1e-3, 1e-1)
    assert parse_domain("train.lr", domain) is domain  # Python callers may pass Tune domains


@pytest.mark.parametrize("spec,message", [
    ("logunifrom(1e-4, 1e-1)", "unknown function 'logunifrom'"),
    ("loguniform(1e-1, 1e-4)", "needs a < b"),
    ("uniform(1, 1)", "needs a < b"),
    ("randint(5, 5)", "needs a < b (b is exclusive)"),
    ("loguniform(-1, 1)", "needs a > 0 (log scale)"),
    ("loguniform(0, 1)", "needs a > 0 (log scale)"),
    ("lograndint(0, 10)", "needs a > 0 (log scale)"),
    ("loguniform(1e-4, 1e-1", "could not read"),
    ("uniform([1, 2)", "could not read the arguments"),
    ("uniform(a, b)", "uniform takes 2 numbers"),
    ("uniform(1, 2, 3)", "uniform takes 2 numbers"),
    ("uniform(1, .inf)", "uniform takes 2 numbers"),
    ("uniform(true, 2)", "uniform takes 2 numbers"),
    ("randint(1.5, 3)", "randint takes 2 integers"),
    ("quniform(0, 1, 0.3)", "multiples of q"),
    ("quniform(0, 1, 0)", "q > 0"),
    ("quniform(0, 1e308, 1e-300)", "more than 1e+12 steps"),  # overflowed to inf, then crashed
    ("quniform(0, 1e6, 1e-9)", "more than 1e+12 steps"),
    ("randint(0, 1000000000000000000000000000000)", "beyond 64-bit integers"),
    ("lograndint(1, 100000000000000000000)", "beyond 64-bit integers"),
    ("choice([])", "choice([]) is empty"),
    ("grid([])", "grid([]) is empty"),
    ([], "choice([]) is empty"),
    ("choice(simclr, byol)", "choice takes one list"),
    ({"low": 1}, "a mapping is not a domain"),
    (tune.sample_from(lambda spec: 1), "Function domains are not supported"),
])
def test_bad_specs_raise_one_line_naming_the_key_and_showing_the_grammar(spec, message):
    with pytest.raises(ConfigError) as e:
        parse_domain("train.lr", spec)
    text = str(e.value)
    assert text.startswith("search.space.train.lr: ") and message in text
    assert "grammar: loguniform(a, b)" in text and "\n" not in text


# ---------------------------------------------------------------------------------------------
# The registered spaces

def _searches(cfg, name: str) -> bool:
    """A base's space trains that base; an augmentation method's space (`pinda`, `pinda_vision`)
    stacks that method."""
    return cfg.method.base == name or name.partition("_")[0] in cfg.method.augment


@pytest.mark.parametrize("name", sorted(SPACES))
def test_every_key_of_every_registered_space_is_a_real_config_key(name):
    space = SPACES[name]
    check_keys(space)
    keys = set(space.params) | {k for p in space.points_to_evaluate for k in p}
    keys |= {k for g in space.grid_presets.values() for k in g}
    assert keys <= dotted_keys()
    assert not any(k.startswith(("search.", "resources.")) for k in keys)
    assert space.name == name  # `space: byol` searches BYOL, `space: pinda` searches PiNDA
    assert space.params["method.base"] == name or name.partition("_")[0] in space.params.get(
        "method.augment", ()
    )


@pytest.mark.parametrize("name", sorted(SPACES))
def test_points_and_samples_of_every_registered_space_make_valid_configs(name):
    space = SPACES[name]
    assert space.points_to_evaluate, "the papers' defaults come first"
    runs = [{**constants(space), **p} for p in space.points_to_evaluate]
    runs += [sample_values(space, seed) for seed in range(3)]
    for values in runs:
        cfg = from_dict(set_values({}, values))
        assert _searches(cfg, name)
    assert sample_values(space, 7) == sample_values(space, 7)  # seeded


@pytest.mark.parametrize("name", sorted(SPACES))
@pytest.mark.parametrize("algorithm", ["optuna", "random", "grid"])
def test_every_registered_space_resolves_under_every_algorithm(name, algorithm):
    assert resolve_space(SearchConfig(space=name, algorithm=algorithm)) is SPACES[name]


def test_temperatures_follow_the_papers():
    assert "train.temperature" not in SPACES["simsiam"].params | SPACES["byol"].params
    assert SPACES["simclr"].points_to_evaluate[0]["train.temperature"] == 0.5  # SimCLR CIFAR-10
    assert SPACES["moco"].points_to_evaluate[0]["train.temperature"] == 0.2  # MoCo v2
    assert {"method.momentum", "method.queue_size"} <= set(SPACES["moco"].params)


@pytest.mark.parametrize("name", sorted(SPACES))
def test_grid_crosses_the_preset_and_holds_the_rest_at_the_paper_default(name):
    space = SPACES[name]
    params = grid_params(space)
    preset, first = space.grid_presets["default"], space.points_to_evaluate[0]
    variants = [spec for _, spec in generate_variants(params)]  # Tune's own grid expansion
    assert len(variants) == math.prod(len(v) for v in preset.values())
    for spec in variants:
        cfg = from_dict(set_values({}, spec))
        assert _searches(cfg, name)
        for key in searched(space):
            if key not in preset:
                assert spec[key] == first[key]


# ---------------------------------------------------------------------------------------------
# resolve_space

def test_resolve_an_inline_mapping_written_in_yaml():
    data = yaml.safe_load("""
search:
  space:
    train.lr: loguniform(1e-4, 1e-1)
    method.base: choice([simclr, byol])
    train.batch_size: grid([128, 256])
    model.proj_dim: [64, 128]
    train.epochs: 3
""")
    space = resolve_space(from_dict(data).search)
    assert space.name == "inline" and space.points_to_evaluate == [] and space.define_by_run is None
    assert isinstance(space.params["train.lr"], Float) and space.params["train.epochs"] == 3
    assert space.params["train.batch_size"] == tune.grid_search([128, 256])
    for seed in range(5):
        cfg = from_dict(set_values({}, sample_values(space, seed)))
        assert cfg.train.epochs == 3 and cfg.model.proj_dim in (64, 128)
    with pytest.raises(
        ConfigError, match=r"^search.space.train.lr: algorithm grid cannot enumerate loguniform"
    ):
        grid = SearchConfig(space=data["search"]["space"], algorithm="grid")
        check_algorithm(grid, resolve_space(grid))


def test_inline_grid_crosses_grid_and_choice_entries():
    space = resolve_space(SearchConfig(algorithm="grid", space={
        "method.base": "choice([simclr, byol])", "train.batch_size": "grid([128, 256])", "train.epochs": 2}))
    variants = [spec for _, spec in generate_variants(grid_params(space))]
    assert len(variants) == 4 and all(v["train.epochs"] == 2 for v in variants)
    assert {(v["method.base"], v["train.batch_size"]) for v in variants} == {
        ("simclr", 128), ("simclr", 256), ("byol", 128), ("byol", 256)}


@pytest.mark.parametrize(
    "space,message",
    [
        ("simclrr", "search.space: unknown space 'simclrr' (known: simclr, byol, moco, simsiam"),
        ({}, "search.space: the mapping is empty"),
        (None, "search.space: no space given"),
        (
            {"train.lrr": "loguniform(1e-4, 1e-1)"},
            "search.space.train.lrr: unknown config key (did you mean train.lr?)",
        ),
        ({"lr": "loguniform(1e-4, 1e-1)"}, "search.space.lr: unknown config key"),
        (
            {"search.seed": "choice([0, 1])"},
            "search.space.search.seed: search.* and resources.* keys cannot be searched",
        ),
        ({"resources.num_workers": [1, 2]}, "search.space.resources.num_workers: search.* and resources.*"),
        ({"train.lr": "uniform(1, 0)"}, "search.space.train.lr: uniform(1, 0) needs a < b"),
        ({"train.epochs": 3}, "search.space: every entry is a constant, nothing to search"),
    ],
)
def test_resolve_refuses_with_one_line_naming_the_key(space, message):
    with pytest.raises(ConfigError) as e:
        resolve_space(SearchConfig(space=space))
    assert str(e.value).startswith(message), str(e.value)


def test_points_and_presets_must_fit_the_space():
    params = {"train.lr": tune.loguniform(1e-4, 1e-2), "train.batch_size": tune.choice([128, 256])}
    for bad, message in [
        (
            Space("x", params, points_to_evaluate=[{"train.lr": 1e-3}]),
            "train.batch_size: points_to_evaluate[0] gives no value",
        ),
        (
            Space("x", params, points_to_evaluate=[{"train.lr": 1.0, "train.batch_size": 128}]),
            "outside loguniform(0.0001, 0.01)",
        ),
        (
            Space("x", params, grid_presets={"default": {"train.batch_size": [64]}}),
            "values [64] are outside choice([128, 256])",
        ),
        (
            Space("x", params, grid_presets={"default": {"train.epochs": [1]}}),
            "train.epochs: grid preset 'default' sets a key that is not searched",
        ),
    ]:
        with pytest.raises(ConfigError) as e:
            resolve_space(SearchConfig(space=bad))
        assert str(e.value).startswith("search.space.") and message in str(e.value), str(e.value)


# ---------------------------------------------------------------------------------------------
# Conditional spaces: define-by-run (the pattern PiNDA's `pinda.mu == "learned"` settings use)

def optimizer_space(trial) -> dict:
    """Made-up conditional space over real keys: SGD's momentum exists only when SGD is drawn."""
    optimizer = trial.suggest_categorical("train.optimizer", ["adam", "sgd"])
    trial.suggest_float("train.lr", 1e-4, 1e-1, log=True)
    if optimizer == "sgd":
        trial.suggest_float("train.momentum", 0.8, 0.99)
    return {"train.schedule": "cosine"}  # constants may be returned


CONDITIONAL = Space("optimizer", params={"method.base": "simclr"}, define_by_run=optimizer_space,
                    points_to_evaluate=[{"train.optimizer": "adam", "train.lr": 1e-3},
                                        {"train.optimizer": "sgd", "train.lr": 0.05, "train.momentum": 0.9}])


def test_define_by_run_suggests_momentum_only_with_sgd():
    drawn = set()
    for seed in range(12):
        trial = optuna.create_study(sampler=RandomSampler(seed=seed)).ask()
        assert optimizer_space(trial) == {"train.schedule": "cosine"}
        optimizer = trial.params["train.optimizer"]
        drawn.add(optimizer)
        assert ("train.momentum" in trial.params) == (optimizer == "sgd")
    assert drawn == {"adam", "sgd"}


def test_define_by_run_space_checks_samples_and_resolves():
    check_keys(CONDITIONAL)
    assert resolve_space(SearchConfig(space=CONDITIONAL, algorithm="random")) is CONDITIONAL
    for seed in range(6):
        values = sample_values(CONDITIONAL, seed)
        cfg = from_dict(set_values({}, values))
        assert cfg.train.schedule == "cosine" and cfg.method.base == "simclr"
        assert ("train.momentum" in values) == (cfg.train.optimizer == "sgd")
    with pytest.raises(ConfigError, match="^search.algorithm: grid needs a grid preset"):
        grid = SearchConfig(space=CONDITIONAL, algorithm="grid")
        check_algorithm(grid, resolve_space(grid))


def test_define_by_run_keys_are_checked_in_every_branch():
    def typo(trial):
        if trial.suggest_categorical("train.optimizer", ["adam", "sgd"]) == "sgd":
            trial.suggest_float("train.momentun", 0.8, 0.99)

    with pytest.raises(
        ConfigError,
        match=r"^search.space.train.momentun: unknown config key \(did you mean train.momentum\?\)",
    ):
        check_keys(Space("typo", define_by_run=typo))
    with pytest.raises(ConfigError, match="^search.space.train.epochs: a define-by-run space suggests"):
        resolve_space(
            SearchConfig(
                space=Space("mixed", {"train.epochs": tune.randint(1, 3)}, define_by_run=optimizer_space)
            )
        )


# ---------------------------------------------------------------------------------------------
# What OptunaSearch gets (constructed and asked without a Ray runtime)

def _searcher(space: Space, seed: int) -> OptunaSearch:
    return OptunaSearch(**to_optuna_search_kwargs(space), metric="knn_acc", mode="max",
                        sampler=TPESampler(seed=seed))


def test_optuna_search_runs_the_paper_defaults_first_then_seeded_suggestions():
    space = SPACES["moco"]
    kwargs = to_optuna_search_kwargs(space)
    assert set(kwargs["space"]) == set(searched(space))  # constants go to the Tuner's param_space
    a, b = _searcher(space, 0), _searcher(space, 0)
    for i, point in enumerate(space.points_to_evaluate):
        assert a.suggest(f"t{i}") == point
    extra = [a.suggest("t2"), a.suggest("t3")]
    for i in range(4):
        b.suggest(f"t{i}")
    assert [b._ot_trials["t2"].params, b._ot_trials["t3"].params] == extra  # same seed, same proposals
    for values in extra:
        cfg = from_dict(set_values({}, {**constants(space), **values}))
        assert 1e-4 <= cfg.train.lr <= 1e-2 and cfg.method.queue_size in (1024, 4096, 16384, 65536)


def test_optuna_search_takes_grid_entries_as_categoricals():
    space = resolve_space(
        SearchConfig(space={"train.batch_size": "grid([128, 256])", "train.lr": "loguniform(1e-4, 1e-2)"})
    )
    searcher = _searcher(space, 1)
    assert searcher.suggest("t0")["train.batch_size"] in (128, 256)


def test_optuna_search_with_a_define_by_run_space_and_partial_points():
    searcher = _searcher(CONDITIONAL, 0)
    first, second = searcher.suggest("t0"), searcher.suggest("t1")
    assert first == {"train.optimizer": "adam", "train.lr": 1e-3, "train.schedule": "cosine"}
    assert second == {
        "train.optimizer": "sgd",
        "train.lr": 0.05,
        "train.momentum": 0.9,
        "train.schedule": "cosine",
    }
    third = searcher.suggest("t2")
    assert ("train.momentum" in third) == (third["train.optimizer"] == "sgd")


def test_optuna_searcher_with_a_define_by_run_space_saves_and_restores(tmp_path):
    """Tune pickles the searcher, function included, to resume a search: keep such functions at module
    level."""
    searcher = _searcher(CONDITIONAL, 0)
    searcher.suggest("t0")
    searcher.save(str(tmp_path / "searcher.pkl"))
    restored = OptunaSearch()
    restored.restore(str(tmp_path / "searcher.pkl"))
    assert restored.suggest("t1") == {"train.optimizer": "sgd", "train.lr": 0.05, "train.momentum": 0.9,
                                      "train.schedule": "cosine"}


def test_grid_entries_with_optuna_are_refused_in_one_line():
    """Optuna samples; a grid([...]) would silently become a random choice (SimCLR never ran)."""
    cfg = SearchConfig(space={"method.base": "grid([simclr, byol])", "train.lr": "loguniform(1e-4, 1e-2)"})
    with pytest.raises(
        ConfigError, match=r"^search.space.method.base: grid\(\[...\]\) with algorithm optuna"
    ):
        check_algorithm(cfg, resolve_space(cfg))
    random = SearchConfig(space=dict(cfg.space), algorithm="random")
    check_algorithm(random, resolve_space(random))  # random crosses the grid with the sampled entries


def test_held_keys_leave_the_space_and_its_points():
    cfg = SearchConfig(space="cocor", hold=("method.base", "train.batch_size", "cocor.pool"))
    space = resolve_space(cfg)
    assert not {"method.base", "train.batch_size", "cocor.pool"} & set(space.params)
    assert all("cocor.pool" not in p for p in space.points_to_evaluate)
    with pytest.raises(ConfigError, match="search.hold: 'train.nope' is not a config key"):
        resolve_space(SearchConfig(space="cocor", hold=("train.nope",)))


def test_the_searcher_is_told_only_results_that_carry_the_metric():
    """Trials evaluate the metric at the scheduler's rungs and their last epoch only; Tune's OptunaSearch
    read it from every result (KeyError) before augtune's searcher passed it only those."""
    from augtune.config import load_config
    from augtune.search.searchers import searcher

    cfg = load_config(None, ["search.space=simclr", "search.algorithm=optuna", "search.metric=knn_acc"])
    search, _ = searcher(cfg, resolve_space(cfg.search))
    search.suggest("t0")
    search.on_trial_result("t0", {"epoch": 1, "loss": 4.2, "training_iteration": 1})  # no knn_acc: skipped
    search.on_trial_result("t0", {"epoch": 2, "knn_acc": 0.5, "training_iteration": 2})
    search.on_trial_complete("t0", {"epoch": 3, "knn_acc": 0.8, "training_iteration": 3})
    trial = search._ot_study.trials[search._ot_trials["t0"].number]
    assert trial.intermediate_values == {2: 0.5} and trial.value == 0.8
