"""Sequence classification: generative classifiers (one statseq model per class, Bayes'
rule, optional discriminative MMI training), scikit-learn-style, and their plots."""

from statseq.classify._estimator import ClassifierMixin, SequenceEstimator, check_labels
from statseq.classify.generative import GenerativeClassifier, MMIResult, describe_mmi
from statseq.classify.plots import (
    plot_confusion_matrix,
    plot_reliability_diagram,
    plot_sequence_uncertainty,
)

__all__ = [
    "ClassifierMixin",
    "GenerativeClassifier",
    "MMIResult",
    "SequenceEstimator",
    "check_labels",
    "describe_mmi",
    "plot_confusion_matrix",
    "plot_reliability_diagram",
    "plot_sequence_uncertainty",
]
