"""Plots for sequence classifiers: confusion matrix, reliability diagram, per-sequence
uncertainty. Matplotlib is imported only when a plot is drawn."""

from __future__ import annotations

import numpy as np


def _figure_axes(ax, nrows=1, figsize=(5, 4), **kw):
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(nrows, 1, figsize=figsize, **kw)
        return fig, ax
    return ax.figure if not isinstance(ax, np.ndarray) else ax.flat[0].figure, ax


def _codes(labels, classes):
    index = {(c.item() if isinstance(c, np.generic) else c): i for i, c in enumerate(classes)}
    out = []
    for lab in np.asarray(labels, dtype=object if np.asarray(classes).dtype == object else None):
        key = lab.item() if isinstance(lab, np.generic) else lab
        if key not in index:
            raise ValueError(f"label {lab!r} is not one of the classes {list(classes)}")
        out.append(index[key])
    return np.asarray(out, np.int64)


def _check_proba(proba, num_true):
    p = np.asarray(proba, float)
    if p.ndim != 2 or p.shape[0] != num_true:
        raise ValueError(f"proba must have shape (num_sequences={num_true}, num_classes); "
                         f"got {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0) or np.any(np.abs(p.sum(1) - 1) > 1e-6):
        raise ValueError("proba rows must be probability vectors (non-negative, summing to 1)")
    return p


def confusion_matrix(y_true, y_pred, classes) -> np.ndarray:
    """Counts ``M[i, j]`` of sequences of true class ``classes[i]`` predicted ``classes[j]``.

    Args:
        y_true: true labels.
        y_pred: predicted labels.
        classes: the label order (e.g. a classifier's ``classes_``).

    Returns:
        ``(num_classes, num_classes)`` integer counts.

    Examples:
        >>> confusion_matrix(["a", "b", "b"], ["a", "a", "b"], ["a", "b"]).tolist()
        [[1, 0], [1, 1]]
    """
    t, p = _codes(y_true, classes), _codes(y_pred, classes)
    if t.shape != p.shape:
        raise ValueError(f"y_true has {t.size} labels but y_pred has {p.size}")
    k = len(classes)
    return np.bincount(t * k + p, minlength=k * k).reshape(k, k)


def plot_confusion_matrix(y_true, y_pred, classes, *, normalize=False, ax=None):
    """Confusion matrix as an annotated heat map (rows: true class, columns: predicted).

    Args:
        y_true: true labels.
        y_pred: predicted labels.
        classes: the label order (a classifier's ``classes_``).
        normalize: show row fractions (recall per class) instead of counts.
        ax: matplotlib axes (a new figure when ``None``).

    Returns:
        The matplotlib ``Figure``.

    Examples:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> fig = plot_confusion_matrix([0, 1, 1], [0, 0, 1], [0, 1])
        >>> type(fig).__name__
        'Figure'
    """
    m = confusion_matrix(y_true, y_pred, classes)
    shown = m / np.maximum(m.sum(1, keepdims=True), 1) if normalize else m
    fig, ax = _figure_axes(ax)
    im = ax.imshow(shown, cmap="Blues", vmin=0)
    k = len(classes)
    names = [str(c) for c in classes]
    ax.set_xticks(range(k), names, rotation=45 if k > 4 else 0)
    ax.set_yticks(range(k), names)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    top = shown.max() if shown.size else 1
    for i in range(k):
        for j in range(k):
            text = f"{shown[i, j]:.2f}" if normalize else f"{m[i, j]:d}"
            ax.text(j, i, text, ha="center", va="center",
                    color="white" if shown[i, j] > 0.6 * top else "black")
    ax.set_title(f"accuracy {np.trace(m) / max(m.sum(), 1):.3f} ({m.sum()} sequences)")
    fig.colorbar(im, ax=ax)
    return fig


def reliability_curve(y_true, proba, classes, *, num_bins=10):
    """Top-label calibration: per confidence bin, mean confidence, accuracy and count.

    The confidence of a sequence is its largest class probability; a calibrated
    classifier is right in a fraction ``p`` of the sequences it gives confidence ``p``.

    Args:
        y_true: true labels.
        proba: ``(N, num_classes)`` class probabilities (columns in ``classes`` order).
        classes: the label order.
        num_bins: equal-width bins on ``[0, 1]``.

    Returns:
        ``(confidence, accuracy, counts, edges)``: per-bin mean confidence and accuracy
        (``NaN`` in empty bins), integer counts and the ``num_bins + 1`` bin edges.

    Examples:
        >>> import numpy as np
        >>> conf, acc, n, _ = reliability_curve([0, 1], np.array([[0.9, 0.1], [0.8, 0.2]]),
        ...                                     [0, 1], num_bins=5)
        >>> n.tolist(), float(acc[4])
        ([0, 0, 0, 1, 1], 1.0)
    """
    t = _codes(y_true, classes)
    p = _check_proba(proba, t.size)
    if int(num_bins) < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    conf = p.max(1)
    right = (p.argmax(1) == t).astype(float)
    edges = np.linspace(0.0, 1.0, int(num_bins) + 1)
    which = np.clip(np.digitize(conf, edges[1:-1], right=True), 0, int(num_bins) - 1)
    counts = np.bincount(which, minlength=int(num_bins))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(which, conf, int(num_bins)) / counts
        acc = np.bincount(which, right, int(num_bins)) / counts
    return mean_conf, acc, counts, edges


def plot_reliability_diagram(y_true, proba, classes, *, num_bins=10, ax=None):
    """Reliability diagram: accuracy against confidence per bin, with the bin counts.

    Args:
        y_true: true labels.
        proba: ``(N, num_classes)`` class probabilities (e.g. ``predict_proba``).
        classes: the label order (a classifier's ``classes_``).
        num_bins: equal-width confidence bins.
        ax: two matplotlib axes (curve, counts), or ``None`` for a new figure.

    Returns:
        The matplotlib ``Figure``; its title holds the expected calibration error
        ``sum_b n_b |acc_b - conf_b| / N``.

    Examples:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import numpy as np
        >>> fig = plot_reliability_diagram([0, 1], np.array([[0.9, 0.1], [0.3, 0.7]]), [0, 1])
        >>> len(fig.axes)
        2
    """
    conf, acc, counts, edges = reliability_curve(y_true, proba, classes, num_bins=num_bins)
    if ax is None:
        fig, ax = _figure_axes(None, 2, figsize=(5, 5), sharex=True,
                               gridspec_kw={"height_ratios": [3, 1]})
    else:
        fig = ax[0].figure
    top, bottom = ax[0], ax[1]
    live = counts > 0
    top.plot([0, 1], [0, 1], color="grey", ls="--", lw=1, label="calibrated")
    top.plot(conf[live], acc[live], marker="o", label="classifier")
    top.set_ylabel("accuracy")
    top.set_ylim(0, 1.02)
    top.legend(loc="upper left")
    ece = float(np.sum(counts[live] * np.abs(acc[live] - conf[live])) / max(counts.sum(), 1))
    top.set_title(f"reliability (expected calibration error {ece:.3f})")
    width = edges[1] - edges[0]
    bottom.bar(edges[:-1], counts, width=width, align="edge", edgecolor="black")
    for x, n in zip(edges[:-1], counts, strict=True):
        if n:
            bottom.text(x + width / 2, n, str(int(n)), ha="center", va="bottom", fontsize=7)
    bottom.set_xlabel("confidence (largest class probability)")
    bottom.set_ylabel("sequences")
    bottom.set_xlim(0, 1)
    return fig


def plot_sequence_uncertainty(y_true, proba, classes, *, measure="max_prob", ax=None):
    """Per-sequence uncertainty, misclassified sequences marked.

    Args:
        y_true: true labels.
        proba: ``(N, num_classes)`` class probabilities.
        classes: the label order.
        measure: ``"max_prob"`` (the largest class probability) or ``"entropy"`` (of the
            class posterior, in nats).
        ax: matplotlib axes (a new figure when ``None``).

    Returns:
        The matplotlib ``Figure``: one point per sequence (x: its index, grouped by true
        class), correct ones as dots, misclassified ones as red crosses.

    Examples:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> import numpy as np
        >>> fig = plot_sequence_uncertainty([0, 1], np.array([[0.9, 0.1], [0.6, 0.4]]),
        ...                                 [0, 1], measure="entropy")
        >>> type(fig).__name__
        'Figure'
    """
    t = _codes(y_true, classes)
    p = _check_proba(proba, t.size)
    if measure == "max_prob":
        value, label = p.max(1), "largest class probability"
    elif measure == "entropy":
        with np.errstate(divide="ignore", invalid="ignore"):
            value = -np.sum(np.where(p > 0, p * np.log(p), 0.0), axis=1)
        label = "entropy of p(c | y) (nats)"
    else:
        raise ValueError(f"measure must be 'max_prob' or 'entropy', got {measure!r}")
    order = np.argsort(t, kind="stable")
    wrong = p.argmax(1) != t
    fig, ax = _figure_axes(ax, figsize=(7, 3.5))
    x = np.arange(t.size)
    ok = ~wrong[order]
    ax.scatter(x[ok], value[order][ok], s=14, label="correct")
    ax.scatter(x[~ok], value[order][~ok], s=40, marker="x", color="red",
               label=f"misclassified ({int(wrong.sum())})")
    bounds = np.flatnonzero(np.diff(t[order])) + 0.5
    for b in bounds:
        ax.axvline(b, color="grey", lw=0.8)
    ax.set_xlabel("sequence (grouped by true class: "
                  + ", ".join(str(c) for c in np.asarray(classes)[np.unique(t)]) + ")")
    ax.set_ylabel(label)
    ax.legend(loc="best", fontsize=8)
    return fig
