"""Plug-ins the tests and benches install into a run from outside, as a user would; the product knows none."""
