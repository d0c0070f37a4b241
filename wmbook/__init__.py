"""wmbook: a notebook workbook for making world-model inference fast."""

import logging as _logging

__version__ = "0.1.0"


class _DropTorchaoCheckpointNotice(_logging.Filter):
    """diffusers warns "Unable to import `torchao` Tensor objects. This may affect loading checkpoints serialized with
    `torchao`" on import wherever a torchao it does not know is installed (0.18, our `fp8` extra: it moved those
    classes). wmbook loads no torchao-serialized checkpoint, so the notice only clutters every report (a red stderr box
    under the first import cell); the filter drops that one message and nothing else."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return "Unable to import `torchao` Tensor objects" not in record.getMessage()


_logging.getLogger("diffusers.quantizers.torchao.torchao_quantizer").addFilter(_DropTorchaoCheckpointNotice())
