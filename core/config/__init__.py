"""Settings: ``ServerArgs`` (every server flag, with provenance) and the start-up gate."""

from infer.core.config.flags import FLAG_SPECS, SECTIONS, VLLM_ALIASES, ConfigError, FlagSpec
from infer.core.config.server_args import SECTION_MODELS, ServerArgs, read_config_file

__all__ = ["FLAG_SPECS", "SECTIONS", "SECTION_MODELS", "VLLM_ALIASES", "ConfigError", "FlagSpec",
           "ServerArgs", "read_config_file"]
