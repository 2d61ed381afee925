"""The measured results the docs show: each kept as JSON with the machine it ran on and what made its numbers
(:mod:`~captioner.results.record`: the settings, and the fingerprint of the code's behaviour from
:mod:`~captioner.results.fingerprint`), rendered into the pages' tables (:mod:`~captioner.results.render`, formats
in :mod:`~captioner.results.tables`)."""
