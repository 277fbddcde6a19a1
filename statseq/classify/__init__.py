"""Sequence classification: generative classifiers (one statseq model per class, Bayes'
rule, optional discriminative MMI training), scikit-learn-style, and their plots.

Examples:
    >>> import statseq as ss
    >>> clf = ss.classify.GenerativeClassifier(ss.AR(order=1), method="lbfgs")
    >>> sorted(clf.get_params(deep=False))[:3]
    ['class_prior', 'classes', 'fit_options']
"""

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
