"""The contract of every op: its argument checks and its result types, one module per op.

An op has a Triton implementation in ``ops/<op>.py`` and a CPU twin in ``cpu/<op>.py`` with the same
arguments and results; both import the op's module here (``_contracts/<op>.py``) and neither imports the
other, so the twins run where triton is not installed. Nothing here imports triton or numba.

=================== =======================================================================================
``segments``        ``seq_lens`` / ``cu_seqlens`` checked on the host or the device (the ops taking lengths)
``unpad``           ``unpad``, ``pad``, ``unpad_from_mask``: tensor checks, :class:`PackedTokens`
``varlen_metadata`` :class:`VarlenMetadata` and its argument checks
``patchify``        the patch plan of a list or padded tensor of images, :class:`PackedPatches`
``bucket``          patch-count buckets: counts and boundaries, :class:`PatchBuckets`
``vision_counts``   image sizes checked on the host or the device, :class:`TileGrid`, :class:`ResizedSize`
=================== =======================================================================================
"""
