"""The models kvbench runs and plans: where one lives (:mod:`~kvbench.models.locate`: presets, aliases, local
directories, GGUF files, cached hub ids), its config and architecture read without weights
(:mod:`~kvbench.models.config`), the model code a config asks to run (:mod:`~kvbench.models.remote_code`), and
loading it with its tokenizer (:mod:`~kvbench.models.load`). The architecture itself (layers, windows, KV bytes) is
:class:`kvbench.offload.architecture.Architecture`.

Sits below :mod:`kvbench.scenario`, whose ``ModelSpec`` it reads through a protocol of its own
(:class:`~kvbench.models.spec.ModelRef`), and imports nothing of :mod:`kvbench.analysis`.
"""

from kvbench.models.config import load_config, read_architecture
from kvbench.models.load import LoadedModel, load, load_model, load_tokenizer, resolve_device, resolve_dtype
from kvbench.models.locate import locate, preset_names, preset_path

__all__ = ["LoadedModel", "load", "load_config", "load_model", "load_tokenizer", "locate", "preset_names",
           "preset_path", "read_architecture", "resolve_device", "resolve_dtype"]
