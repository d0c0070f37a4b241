"""wmbook: a notebook workbook for making world-model inference fast."""

import logging as _logging
import warnings as _warnings

__version__ = "0.1.0"


class _DropTorchaoCheckpointNotice(_logging.Filter):
    """diffusers warns "Unable to import `torchao` Tensor objects. This may affect loading checkpoints serialized with
    `torchao`" on import wherever a torchao it does not know is installed (0.18, our `fp8` extra: it moved those
    classes). wmbook loads no torchao-serialized checkpoint, so the notice only clutters every report (a red stderr box
    under the first import cell); the filter drops that one message and nothing else."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return "Unable to import `torchao` Tensor objects" not in record.getMessage()


_logging.getLogger("diffusers.quantizers.torchao.torchao_quantizer").addFilter(_DropTorchaoCheckpointNotice())

# torchao 0.18's quantization/quant_api.py has an invalid escape sequence in a docstring: compiling it (its first import
# on a fresh host; diffusers imports it on its own import wherever torchao is installed, so every notebook does, not
# only notebook 05's fp8 row) prints a SyntaxWarning into the report's first import cell. Only that warning from
# torchao's files is dropped: the compiler names the module by the file's path.
_warnings.filterwarnings("ignore", message="invalid escape sequence", category=SyntaxWarning,
                         module=r".*[/\\]torchao[/\\]")
