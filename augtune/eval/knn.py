"""k-nearest-neighbour top-1 accuracy on frozen features (PiNDA B.3: k = 5)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def knn_accuracy(train_x, train_y, test_x, test_y, k: int = 5, batch_size: int = 1024) -> float:
    """Top-1 accuracy of a k-NN classifier with cosine similarity; the train split is the memory.

    Each test row takes the majority label of its ``k`` most similar train rows. A tie in the vote
    goes to the tied class whose neighbours have the larger summed similarity (a tie that survives
    that, which needs exactly equal sums, goes to the smallest label). Test rows are processed
    ``batch_size`` at a time, so at most a (batch_size, N_train) similarity block exists at once.
    Runs on the device of ``train_x``; labels may be any integers (not necessarily 0..C-1).
    Deterministic and uses no random numbers.
    """
    train_x = F.normalize(torch.as_tensor(train_x).detach().float(), dim=1)  # (N, D), unit rows
    device = train_x.device
    test_x = F.normalize(torch.as_tensor(test_x).detach().float().to(device), dim=1)  # (M, D)
    train_y = torch.as_tensor(train_y).to(device).long()
    test_y = torch.as_tensor(test_y).to(device).long()
    if len(test_y) == 0:
        raise ValueError("knn_accuracy: the test split is empty")
    classes, train_c = torch.unique(train_y, return_inverse=True)  # train labels as 0..C-1
    num_classes, k = len(classes), min(k, len(train_y))
    correct = 0
    for start in range(0, len(test_x), batch_size):
        sim = test_x[start:start + batch_size] @ train_x.T  # (B, N) cosine similarities
        top_sim, top_idx = sim.topk(k, dim=1)  # (B, k)
        top_c = train_c[top_idx]  # (B, k)
        votes = torch.zeros(len(sim), num_classes, device=device).scatter_add_(
            1, top_c, torch.ones_like(top_sim)
        )
        sims = torch.zeros(len(sim), num_classes, device=device).scatter_add_(1, top_c, top_sim)
        # lexicographic (votes, summed similarity): only classes with the most votes stay eligible
        sims = sims.masked_fill(votes < votes.max(dim=1, keepdim=True).values, float("-inf"))
        pred = classes[sims.argmax(dim=1)]  # (B,)
        correct += int((pred == test_y[start:start + batch_size]).sum())
    return correct / len(test_y)
