"""Export section: what the Hugging Face model card says about the exported folder."""

from runconfig.base import Section


class ExportConfig(Section):
    model_name: str | None = None  # card title and model-index name (default: run.name)
    repo_id: str | None = None  # Hub id used in the usage snippet, e.g. my-org/my-model
    license: str = "apache-2.0"  # a Hub license id
    language: list[str] = []  # default: data.clean.langid.languages when language ID is on
    datasets: list[str] = []  # Hub dataset ids (default: the hf_dataset sources)
    tags: list[str] = []  # extra Hub tags
