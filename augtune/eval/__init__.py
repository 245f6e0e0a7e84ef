"""Evaluation of frozen features: k-NN, softmax regression, linear probe, k-means clustering, and the
label-free scores (RankMe, alignment, uniformity)."""
from augtune.eval.clustering import cluster_accuracy, kmeans_scores
from augtune.eval.evaluate import METRICS, OUTPUTS, evaluate
from augtune.eval.features import extract_features
from augtune.eval.knn import knn_accuracy
from augtune.eval.label_free import LOWER_IS_BETTER, alignment, rankme, uniformity
from augtune.eval.probes import (
    fit_logistic_regression,
    linear_probe_accuracy,
    select_C,
    softmax_regression_accuracy,
)

__all__ = [
    "LOWER_IS_BETTER",
    "METRICS",
    "OUTPUTS",
    "alignment",
    "cluster_accuracy",
    "evaluate",
    "extract_features",
    "fit_logistic_regression",
    "kmeans_scores",
    "knn_accuracy",
    "linear_probe_accuracy",
    "rankme",
    "select_C",
    "softmax_regression_accuracy",
    "uniformity",
]
