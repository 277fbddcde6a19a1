"""MkDocs hooks for the statseq site (referenced from ``hooks:`` in ``mkdocs.yml``).

The vignettes live in ``vignettes/*.py`` at the repository root (jupytext percent format, so
they are plain Python that ruff and the tests can read). MkDocs only sees files inside
``docs_dir``, so this hook adds every vignette to the build as if it were
``docs/vignettes/<name>.ipynb``: each vignette is first executed into a notebook, several
at a time (one kernel per CPU core, at most ``STATSEQ_DOCS_JOBS`` if set), and mkdocs-jupyter
renders the executed notebooks (its own execution is off, as it would run them one after
another). A vignette that raises fails the build, naming the vignette and the cell. It also

* generates ``vignettes/index.md``, a page listing every vignette with its title;
* fills the ``Vignettes`` section of the nav (left empty in ``mkdocs.yml``) with the overview
  page and one entry per vignette, so a new vignette needs no edit to ``mkdocs.yml``;
* makes sure vignettes execute in full mode with inline figures: ``STATSEQ_SMOKE`` is removed
  from the environment (the tests set it to run vignettes quickly), and ``MPLBACKEND`` is
  removed so that ipykernel installs its inline backend (CI sets ``MPLBACKEND=Agg``, which
  would otherwise suppress every figure). With ``STATSEQ_DOCS_SMOKE=1`` (as ``.ci/run``
  sets) the vignettes execute in smoke mode instead (``STATSEQ_SMOKE=1``): the same cells,
  figures and failure on any error, in a fraction of the time; the published site is built
  in full mode (``mkdocs build``, or ``bash .ci/docs``);
* renders TeX math (``$...$`` and ``$$...$$`` in prose, never inside code) to SVG images at
  build time with matplotlib's mathtext, so equations display without MathJax or any other
  script fetched from a CDN. TeX that mathtext cannot parse is left as written (logged).
"""

from __future__ import annotations

import base64
import functools
import html
import io
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.statseq")

VIGNETTE_DIR = "vignettes"
_TITLE = re.compile(r"^#\s+#\s+(.+?)\s*$")


def _repo_root(config) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def _vignettes(config) -> list[Path]:
    return sorted((_repo_root(config) / VIGNETTE_DIR).glob("*.py"))


def _title(path: Path) -> str:
    """The first ``# # Heading`` of a jupytext percent-format file, else the file name."""
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _TITLE.match(line)
        if match:
            return match.group(1)
    return path.stem.replace("_", " ")


def _jaxlib_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jaxlib")
    except PackageNotFoundError:  # pragma: no cover - jaxlib is a jax dependency
        return ""


def docs_smoke() -> bool:
    """Whether this build executes the vignettes in smoke mode (``STATSEQ_DOCS_SMOKE=1``)."""
    return os.environ.get("STATSEQ_DOCS_SMOKE", "").strip() not in ("", "0")


def on_config(config):
    # Vignettes render with figures, in full mode unless STATSEQ_DOCS_SMOKE asks for smoke.
    if docs_smoke():
        os.environ["STATSEQ_SMOKE"] = "1"
        # Smoke runs are compile-bound and assert no numbers, so their kernels compile at
        # XLA -O0, as the test suite does (tests/conftest.py); the full build stays optimized.
        # On jaxlib 0.10.x also with the older fusion emitters (about 30 % less compile
        # time; jaxlib 0.12 does not know the flag), as tests/conftest.py does.
        flags = ["--xla_backend_optimization_level=0", "--xla_cpu_parallel_codegen_split_count=1",
                 "--xla_llvm_disable_expensive_passes=true"]
        if _jaxlib_version().startswith("0.10."):
            flags.append("--xla_cpu_use_fusion_emitters=false")
        for flag in flags:
            if flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
                os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
        log.info("STATSEQ_DOCS_SMOKE is set: vignettes execute in smoke mode (XLA -O0)")
    else:
        os.environ.pop("STATSEQ_SMOKE", None)
    os.environ.pop("MPLBACKEND", None)

    vignettes = _vignettes(config)
    entries = [{"Overview": f"{VIGNETTE_DIR}/index.md"}]
    entries += [{_title(p): f"{VIGNETTE_DIR}/{p.stem}.ipynb"} for p in vignettes]
    for item in config["nav"] or []:
        if isinstance(item, dict) and "Vignettes" in item:
            item["Vignettes"] = entries
    return config


# Run before mkdocs-jupyter's on_files (default priority 0), which wraps the notebook files.
@event_priority(50)
def on_files(files: Files, config) -> Files:
    vignettes = _vignettes(config)
    out_dir = _execute_all(vignettes)
    for path in vignettes:
        uri = f"{VIGNETTE_DIR}/{path.stem}.ipynb"
        if files.get_file_from_path(uri) is None:
            files.append(
                File(
                    uri,
                    src_dir=str(out_dir),
                    dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"],
                )
            )
    lines = [
        "# Vignettes",
        "",
        "Worked examples, executed when the documentation is built. Each is a "
        "[jupytext](https://jupytext.readthedocs.io) percent-format Python file in "
        "`vignettes/`: run it as a script, open it as a notebook in Jupyter, or read it here.",
        "",
    ]
    if vignettes:
        lines += [f"- [{_title(p)}]({p.stem}.ipynb)" for p in vignettes]
    else:
        lines.append("No vignettes yet.")
    files.append(
        File.generated(config, f"{VIGNETTE_DIR}/index.md", content="\n".join(lines) + "\n")
    )
    return files


# ---- TeX math to SVG, offline ------------------------------------------------------------


# Run in a fresh interpreter per vignette: read the percent-format file with jupytext,
# execute it with nbclient in the vignette's folder (as mkdocs-jupyter would) and write
# the executed notebook.
_EXECUTE = """
import sys
import jupytext
import nbformat
from nbclient import NotebookClient

src, dst, started = sys.argv[1], sys.argv[2], sys.argv[4]
nb = jupytext.read(src)
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                             "language": "python"}

def kernel_ready(**kwargs):  # the kernel holds its ports: the next one may start
    open(started, "w").close()

NotebookClient(nb, timeout=600, kernel_name="python3", on_notebook_start=kernel_ready,
               resources={"metadata": {"path": sys.argv[3]}}).execute()
nbformat.write(nb, dst)
"""


# Full-mode CPU seconds of each vignette (run as a script, one process, a fresh compilation
# cache; measured Nov 26 on the shared 2-core machine under load, so inflated alike).
# `_execute_all` logs each one's wall time in every build: update the table from there.
# Only the order of execution uses them: longest first, so that with two kernels the build
# is not left waiting on one long vignette started last (the longest-processing-time rule).
# A vignette missing here (a new one) starts right after the longest known one.
FULL_MODE_CPU_S = {
    "05_bayesian_inference": 148,
    "03_state_space_models": 99,
    "04_neural_sequence_models": 86,
    "13_markov_chains_to_mamba": 77,
    "08_seatbelt_intervention": 69,
    "02_hmms_are_rnns": 62,
    "10_many_sequences": 59,
    "11_long_sequences": 59,
    "14_switching_regimes": 53,
    "06_markov_switching": 38,
    "09_covariates": 36,
    "07_forecast_evaluation": 34,
    "01_autoregressive_likelihoods": 28,
    "15_deep_state_space": 16,
    # not measured in full mode; placed by their smoke-mode cost in CI (Nov 27)
    "17_forecasting_from_context": 45,
    "16_classifying_sequences": 30,
    "12_parallel_rnn": 20,
}


def _schedule(vignettes: list[Path]) -> list[Path]:
    """``vignettes`` in execution order: longest known first, then unknown ones, then the
    other known ones by decreasing cost (ties by name)."""
    known = sorted((p for p in vignettes if p.stem in FULL_MODE_CPU_S),
                   key=lambda p: (-FULL_MODE_CPU_S[p.stem], p.name))
    unknown = sorted(p for p in vignettes if p.stem not in FULL_MODE_CPU_S)
    return known[:1] + unknown + known[1:]


def _execute_all(vignettes: list[Path]) -> Path:
    """Execute every vignette into ``<tmp>/vignettes/<name>.ipynb``, a few at a time."""
    out_dir = Path(tempfile.mkdtemp(prefix="statseq-vignettes-"))
    (out_dir / VIGNETTE_DIR).mkdir()
    jobs = int(os.environ.get("STATSEQ_DOCS_JOBS") or os.cpu_count() or 1)
    pending = _schedule(vignettes)
    running: list[tuple[Path, subprocess.Popen, float]] = []
    failed: list[str] = []
    last_launch = -float("inf")
    last_started: Path | None = None
    while pending or running:
        # one kernel start at a time: kernels started at the same moment can race for the
        # same free TCP ports, and a client then waits on a kernel it is not talking to
        # (seen once in CI: a vignette hung with its kernel idle). The next launch waits
        # until the last kernel is ready (its marker file exists), or 15 s at most.
        while (pending and len(running) < max(jobs, 1)
               and (last_started is None or last_started.exists()
                    or time.monotonic() - last_launch >= 15.0)):
            last_launch = time.monotonic()
            path = pending.pop(0)
            log.info("executing vignette %s", path.name)
            dst = out_dir / VIGNETTE_DIR / f"{path.stem}.ipynb"
            last_started = out_dir / f"{path.stem}.started"
            with open(out_dir / f"{path.stem}.log", "w") as out:
                running.append((path, subprocess.Popen(
                    [sys.executable, "-c", _EXECUTE, str(path), str(dst), str(path.parent),
                     str(last_started)],
                    stdout=out, stderr=subprocess.STDOUT), last_launch))
        done = next((r for r in running if r[1].poll() is not None), None)
        if done is None or not running:
            time.sleep(0.2)
            continue
        running.remove(done)
        path, proc, started = done
        log.info("vignette %s executed in %.0f s (wall)", path.name, time.monotonic() - started)
        if proc.returncode != 0:
            output = (out_dir / f"{path.stem}.log").read_text(errors="replace")
            failed.append(f"{path.name}:\n{output[-4000:]}")
    if failed:
        raise RuntimeError("vignettes failed to execute:\n" + "\n".join(failed))
    return out_dir


_MATH_FONT_SIZE = 16.0  # mathtext units per em of the surrounding text
_SKIP = re.compile(r"(<(pre|code|script|style|textarea|svg)\b.*?</\2\s*>)", re.S | re.I)
_DISPLAY = re.compile(r"\$\$([^$<>]+?)\$\$")
_INLINE = re.compile(r"(?<![\\$\w])\$(?![\s$])([^$<>\n]+?)(?<![\s\\])\$(?![\w$])")


@functools.cache
def _tex_to_img(tex: str, display: bool) -> str | None:
    """An ``<img>`` holding ``tex`` rendered by matplotlib mathtext, or None if unsupported."""
    import matplotlib
    from matplotlib import mathtext
    from matplotlib.font_manager import FontProperties

    source = "$" + " ".join(tex.split()) + "$"
    prop = FontProperties(size=_MATH_FONT_SIZE)
    rc = {"mathtext.fontset": "cm", "svg.fonttype": "path", "svg.hashsalt": "statseq"}
    try:
        with matplotlib.rc_context(rc):
            width, height, depth, *_ = mathtext.MathTextParser("path").parse(
                source, dpi=72, prop=prop
            )
            buf = io.BytesIO()
            mathtext.math_to_image(source, buf, prop=prop, dpi=72, format="svg")
    except Exception as err:  # any parse failure leaves the TeX as written
        log.info("math left as TeX (mathtext cannot render %r: %s)", tex, str(err).strip())
        return None
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    em = _MATH_FONT_SIZE
    style = f"height:{height / em:.3f}em;width:{width / em:.3f}em"
    if not display:
        style += f";vertical-align:{-depth / em:.3f}em"
    cls = "ss-math ss-math--display" if display else "ss-math"
    return (
        f'<img class="{cls}" style="{style}" alt="{html.escape(tex.strip())}" '
        f'src="data:image/svg+xml;base64,{data}">'
    )


def _render_math(text: str) -> str:
    def display(m):
        img = _tex_to_img(html.unescape(m.group(1)), True)
        return m.group(0) if img is None else f'<span class="ss-math-block">{img}</span>'

    def inline(m):
        img = _tex_to_img(html.unescape(m.group(1)), False)
        return m.group(0) if img is None else img

    return _INLINE.sub(inline, _DISPLAY.sub(display, text))


def on_page_content(html_content: str, page, config, files) -> str:
    if "$" not in html_content:
        return html_content
    parts = _SKIP.split(html_content)
    # re.split with two groups yields [text, whole_match, tag_name, text, ...]
    out = []
    for i in range(0, len(parts), 3):
        out.append(_render_math(parts[i]))
        if i + 1 < len(parts):
            out.append(parts[i + 1])
    return "".join(out)
