"""The prepared tiny runs of tests/pretrain (session fixtures), for the fault tests that train."""

from tests.pretrain.conftest import cleaned_corpus, roberta_run  # noqa: F401
