"""Sequence classification: generative classifiers (one statseq model per class, Bayes'
rule, optional discriminative MMI training), scikit-learn-style, and their plots.

Examples:
    >>> import statseq as ss
    >>> clf = ss.classify.GenerativeClassifier(ss.AR(order=1), method="lbfgs")
    >>> sorted(clf.get_params(deep=False))[:3]
    ['class_prior', 'classes', 'fit_options']
"""

from statseq.classify._estimator import ClassifierMixin, SequenceEstimator, check_labels
from statseq.classify.embedding import EmbeddedBackbone, EmbeddingParams, pad_tokens
from statseq.classify.generative import GenerativeClassifier, MMIResult, describe_mmi
from statseq.classify.plots import (
    plot_confusion_matrix,
    plot_reliability_diagram,
    plot_sequence_uncertainty,
)
from statseq.classify.seq2vec import (
    EncoderParams,
    Seq2VecParams,
    SequenceClassifier,
    SequenceEncoder,
    SequenceLabeller,
    SequenceRegressor,
    encoder_backbone,
    labelling_accuracy,
    labelling_log_loss,
    pad_labels,
    pad_sequences,
    reverse_within_lengths,
)
from statseq.classify.seq2vec_bayes import Seq2VecTarget, bayes_target

__all__ = [
    "ClassifierMixin",
    "EncoderParams",
    "GenerativeClassifier",
    "MMIResult",
    "Seq2VecParams",
    "SequenceClassifier",
    "SequenceEncoder",
    "SequenceEstimator",
    "SequenceLabeller",
    "SequenceRegressor",
    "check_labels",
    "describe_mmi",
    "encoder_backbone",
    "labelling_accuracy",
    "labelling_log_loss",
    "pad_labels",
    "pad_sequences",
    "plot_confusion_matrix",
    "plot_reliability_diagram",
    "plot_sequence_uncertainty",
    "reverse_within_lengths",
    "EmbeddedBackbone",
    "EmbeddingParams",
    "pad_tokens",
    "Seq2VecTarget",
    "bayes_target",
]
