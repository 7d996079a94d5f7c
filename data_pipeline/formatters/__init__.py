"""Formatters: steps of the cleaning chain that rewrite a document's text and never drop it (datatrove's
`BaseFormatter`). Each is registered as every step is (`lmstack.filters` entry points) and counts what it did:
documents changed and spans replaced per kind, in the clean report's `formatter_stats`."""
