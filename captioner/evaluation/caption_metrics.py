"""Corpus-level caption metrics (BLEU-1..4, METEOR, ROUGE-L, CIDEr, optionally SPICE) and COCO results files.

The scores are those of the COCO caption evaluation code (``pycocoevalcap``): captions tokenized by its Stanford
PTB tokenizer, then scored by its ``Bleu(4)``, ``Meteor``, ``Rouge`` and ``Cider`` scorers. Both Java programs
ship inside the ``pycocoevalcap`` wheel, so nothing is downloaded: the tokenizer is fed through a pipe (its own
temporary file next to the jar fails where site-packages is read-only); METEOR 1.5 is slow to start, so its
process is kept between scores (:class:`_KeptMeteor`, :func:`meteor_kept`) and closed after
:data:`METEOR_KEEP_ALIVE_S` seconds idle, at exit and after a failure.

Without ``java`` on PATH the captions are tokenized by :func:`captioner.data.text.tokenize`, so BLEU, ROUGE-L
and CIDEr are the same; METEOR and SPICE are left out with one warning line. SPICE needs the Stanford CoreNLP
3.6.0 jars, which this module never downloads; without them it is skipped with a warning.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor import meteor as meteor_module
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer import ptbtokenizer

from captioner.core.files import write_file
from captioner.data.text import PUNCTUATION, tokenize
from captioner.errors import CaptionerError

log = logging.getLogger(__name__)

METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr")
"""The keys of :func:`score_captions`'s result with Java (plus ``"SPICE"`` when it was requested and could run);
without Java, all but ``"METEOR"``."""

_SPECIAL_TOKENS = re.compile(r"<(?:start|end|pad)>")
_TOKENIZER_JAR = Path(ptbtokenizer.__file__).with_name(ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR)
_METEOR_JAR = Path(meteor_module.__file__).with_name(meteor_module.METEOR_JAR)
_SPICE_DIR = Path(meteor_module.__file__).parent.parent / "spice"
_SPICE_CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
_METEOR_CLOSE_TIMEOUT_S = 10
METEOR_KEEP_ALIVE_S = 30.0
"""Seconds the METEOR process is kept after a score, for the next one."""


def score_captions(references: Mapping[int, list[str]], candidates: Mapping[int, str], *,
                   spice: bool = False, java: bool = True) -> dict[str, float]:
    """Corpus-level scores of ``candidates`` against ``references`` (image id -> plain text), COCO style.

    Every candidate image needs a reference; ``<start>``, ``<end>`` and ``<pad>`` are removed.
    ``spice``: also SPICE where its jars are installed. ``java=False`` (a quick score during training), or no
    ``java`` on PATH (with a warning), tokenizes in Python and leaves METEOR and SPICE out.

    Returns :data:`METRICS` -> float, all but CIDEr in [0, 1]. Raises ``ValueError`` for no candidates or one
    without references, :class:`CaptionerError` when Java fails.
    """
    image_ids = sorted(candidates)
    if not image_ids:
        raise ValueError("no candidate captions to score")
    for image_id in image_ids:
        if not references.get(image_id):
            raise ValueError(f"image id {image_id} has a candidate caption but no reference captions")
    reference_texts = [_strip_special_tokens(text) for image_id in image_ids for text in references[image_id]]
    candidate_texts = [_strip_special_tokens(candidates[image_id]) for image_id in image_ids]
    java_path = shutil.which("java") if java else None
    if java and java_path is None:
        log.warning("%s skipped: java is not on PATH (BLEU, ROUGE-L and CIDEr come from the Python PTB tokenizer, "
                    "which gives the Java tokens)", "METEOR and SPICE" if spice else "METEOR")
    if java_path:
        tokenized = iter(ptb_tokenize(reference_texts + candidate_texts, java=java_path))
    else:
        tokenized = iter(" ".join(tokenize(text)) for text in reference_texts + candidate_texts)
    gts = {image_id: [next(tokenized) for _ in references[image_id]] for image_id in image_ids}
    res = {image_id: [next(tokenized)] for image_id in image_ids}

    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    scores = {f"BLEU-{n}": float(value) for n, value in enumerate(bleu, start=1)}
    if java_path:
        scores["METEOR"] = _KEPT_METEOR.score(gts, res, java_path)
    scores["ROUGE-L"] = float(Rouge().compute_score(gts, res)[0])
    scores["CIDEr"] = float(Cider().compute_score(gts, res)[0])
    if spice and java_path:
        spice_score = _spice_score(gts, res)
        if spice_score is not None:
            scores["SPICE"] = spice_score
    return scores


def write_coco_results(candidates: Mapping[int, str], path: str | os.PathLike[str]) -> None:
    """Write ``candidates`` as a COCO results file: ``[{"image_id": int, "caption": str}, ...]`` by image id."""
    results = [{"image_id": int(image_id), "caption": str(candidates[image_id])} for image_id in sorted(candidates)]
    write_file(path, json.dumps(results, ensure_ascii=False))


def ptb_tokenize(texts: list[str], *, java: str | None = None) -> list[str]:
    """Tokenize ``texts`` as ``pycocoevalcap``'s PTBTokenizer does: one Java run for all of them.

    Each text comes back lower-cased, split into PTB tokens joined by single spaces, with the tokens
    in ``PTBTokenizer``'s punctuation list removed. Line breaks inside a text are treated as spaces.
    :func:`captioner.data.text.tokenize` gives the same tokens without Java.
    """
    if not texts:
        return []
    java = java or _find_java()
    lines = [" ".join(text.split()) for text in texts]
    command = [java, "-cp", str(_TOKENIZER_JAR), "edu.stanford.nlp.process.PTBTokenizer",
               "-preserveLines", "-lowerCase", "-encoding", "utf-8"]
    process = subprocess.run(command, input="\n".join(lines).encode("utf-8"), capture_output=True, check=False)
    output = process.stdout.decode("utf-8").split("\n")
    if process.returncode != 0 or len(output) != len(lines):
        detail = _last_line(process.stderr.decode("utf-8", errors="replace"))
        raise CaptionerError(f"{_TOKENIZER_JAR}: the PTB tokenizer failed (exit status {process.returncode}, "
                             f"{len(output)} lines out for {len(lines)} in): {detail}")
    return [" ".join(token for token in line.split() if token not in PUNCTUATION) for line in output]


def _strip_special_tokens(text: str) -> str:
    """``text`` without ``<start>``, ``<end>`` and ``<pad>``, its whitespace collapsed to single spaces."""
    return " ".join(_SPECIAL_TOKENS.sub(" ", text).split())


def _find_java() -> str:
    """The path of the ``java`` executable, or a :class:`CaptionerError` saying it is needed."""
    java = shutil.which("java")
    if java is None:
        raise CaptionerError("java: not found on PATH; the Java PTB tokenizer needs Java 8 or newer "
                             "(e.g. `apt-get install default-jre-headless`)")
    return java


class _MeteorProcess(meteor_module.Meteor):
    """``pycocoevalcap``'s METEOR client, started with an explicit ``java`` and with a :meth:`close`.

    The parent class keeps its Java process open for the object's lifetime and only stops it in
    ``__del__`` (which deadlocks if a scoring call failed while holding its lock). Here the process is
    stopped by :meth:`close`, which is idempotent and lock-free, and its stderr goes to a temporary
    file (read for the error message) rather than to a pipe nobody drains.
    """

    def __init__(self, java: str):
        self.java = java
        self.meteor_cmd = [java, "-jar", "-Xmx2G", _METEOR_JAR.name, "-", "-", "-stdio", "-l", "en", "-norm"]
        self.stderr_file = tempfile.TemporaryFile()
        self.meteor_p = subprocess.Popen(self.meteor_cmd, cwd=_METEOR_JAR.parent, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self.stderr_file)
        self.lock = threading.Lock()

    def stderr_tail(self) -> str:
        """The last non-empty line the Java process wrote to stderr so far."""
        self.stderr_file.seek(0)
        return _last_line(self.stderr_file.read().decode("utf-8", errors="replace"))

    def close(self) -> None:
        """Stop the Java process (end of input, then kill if it lingers) and release its pipes."""
        process = self.meteor_p
        if process.poll() is None:
            try:
                process.stdin.close()
                process.wait(timeout=_METEOR_CLOSE_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
        for stream in (process.stdin, process.stdout, self.stderr_file):
            try:
                stream.close()
            except OSError:         # a pipe whose reader died: its unwritten bytes go nowhere
                pass

    def __del__(self):
        if hasattr(self, "meteor_p"):  # __init__ got as far as starting the process
            self.close()


class _KeptMeteor:
    """This process's METEOR Java process, started at the first score (or ahead of it, by :meth:`held`) and kept
    while scores come within :data:`METEOR_KEEP_ALIVE_S` seconds of one another or a :meth:`held` scope is open;
    closed after that, at exit, and when a score fails (a fresh one then tries once more). A forked child starts
    its own. Scores are taken one at a time."""

    def __init__(self):
        self._reset()

    def _reset(self) -> None:
        self.lock = threading.Lock()
        self.process: _MeteorProcess | None = None
        self.timer: threading.Timer | None = None
        self.generation = 0          # bumped by every score and scope: a timer armed before it closes nothing
        self.holds = 0               # open held() scopes: no idle timer closes the process meanwhile

    def _alive(self, java: str) -> bool:
        return self.process is not None and self.process.java == java and self.process.meteor_p.poll() is None

    def _touch(self) -> None:
        """A use now: the idle timer armed before it closes nothing."""
        self.generation += 1
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _arm_timer(self) -> None:
        if self.holds == 0:
            self.timer = threading.Timer(METEOR_KEEP_ALIVE_S, self._close_if_idle, args=(self.generation,))
            self.timer.daemon = True        # never keeps the interpreter from exiting
            self.timer.start()

    @contextmanager
    def held(self, java: str | None) -> Iterator[None]:
        """Keep the process open for the scores inside the scope, however far apart (no idle timer meanwhile;
        armed again as the scope closes), and start it now, unless one is kept, without waiting for it: the Java
        process loads its paraphrase table (seconds) while this one decodes the captions it is to score. ``java``:
        the ``java`` executable the scores will use (None: no Java, nothing is started)."""
        with self.lock:
            self._touch()
            if java and not self._alive(java):
                self.close()
                try:
                    self.process = _MeteorProcess(java)
                except OSError:         # not startable: the first score tries again and says why
                    self.process = None
            self.holds += 1
        try:
            yield
        finally:
            with self.lock:
                self.holds -= 1
                self._touch()
                if self.process is not None:
                    self._arm_timer()

    def score(self, gts: dict[int, list[str]], res: dict[int, list[str]], java: str) -> float:
        """Corpus METEOR 1.5 of tokenized ``res`` against ``gts``."""
        # "|||" separates fields in METEOR's line protocol; pycocoevalcap only removes it from hypotheses.
        gts = {image_id: [text.replace("|||", " ") for text in texts] for image_id, texts in gts.items()}
        with self.lock:
            self._touch()
            kept = self._alive(java)
            if not kept:
                self.close()
            for attempt in ("kept", "fresh") if kept else ("fresh",):
                if attempt == "fresh":
                    self.process = _MeteorProcess(java)
                try:
                    score, _ = self.process.compute_score(gts, res)
                    break
                except (OSError, ValueError) as error:
                    detail = f"{_METEOR_JAR}: METEOR failed ({error}): {self.process.stderr_tail()}"
                    self.close()
            else:
                raise CaptionerError(detail) from None
            self._arm_timer()
            return float(score)

    def _close_if_idle(self, generation: int) -> None:
        with self.lock:
            if generation == self.generation and self.holds == 0:
                self.close()

    def close(self) -> None:
        """Stop the kept process, if any (idempotent)."""
        if self.process is not None:
            self.process.close()
            self.process = None

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's process without closing it (it is the parent's) and the lock."""
        if self.process is not None:
            del self.process.meteor_p      # so that its __del__ leaves the parent's Java process alone
        self._reset()


_KEPT_METEOR = _KeptMeteor()
atexit.register(_KEPT_METEOR.close)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_KEPT_METEOR.forget_after_fork)


def meteor_kept():
    """A scope in which this process's METEOR Java process stays open between scores (see
    :meth:`_KeptMeteor.held`): ``with meteor_kept():`` around the decoding and scoring of one or several runs starts
    it at once (where ``java`` is on PATH), so that it loads while the captions are decoded."""
    return _KEPT_METEOR.held(shutil.which("java"))


def _spice_score(gts: dict[int, list[str]], res: dict[int, list[str]]) -> float | None:
    """Corpus SPICE by ``pycocoevalcap``'s scorer, or ``None`` (with a logged warning saying why) when it cannot run.

    ``pycocoevalcap`` would download Stanford CoreNLP on first use; this function checks for the jars
    first and never starts that download.
    """
    missing = [name for name in _SPICE_CORENLP_JARS if not (_SPICE_DIR / "lib" / name).exists()]
    if missing:
        log.warning("SPICE skipped: %s missing from %s (pycocoevalcap would download Stanford CoreNLP 3.6.0; "
                    "this code never downloads, so put the jars there by hand to enable SPICE)",
                    " and ".join(missing), _SPICE_DIR / "lib")
        return None
    from pycocoevalcap.spice.spice import (
        Spice,  # optional: only where the CoreNLP jars were installed by hand
    )

    try:
        score, _ = Spice().compute_score(gts, res)
    except (OSError, subprocess.CalledProcessError) as error:
        log.warning("SPICE skipped: %s failed: %s", _SPICE_DIR / "spice-1.0.jar", error)
        return None
    return float(score)


def _last_line(text: str) -> str:
    """The last non-blank line of ``text`` (a subprocess's stderr), stripped."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no error output"
