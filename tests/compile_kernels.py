"""Compiles every Triton kernel of omnibal_kernels.ops ahead of time for a CUDA target, without a GPU.

Run as a script (with TRITON_INTERPRET unset, so the kernels are real JIT functions): prints one line per
kernel configuration, tab-separated: "ok", NAME, LOADS, STORES (the global memory instructions of the PTX, as
JSON), or "FAILED", NAME, the error; exits 1 if any failed. The signatures are those the launchers pass: tensors as
typed pointers (raw-bits integer views where the launcher copies bits), Python ints as i32 (i64 where they can pass
2**31), constexprs with the values the launchers choose. Like the JIT on a real launch, pointers are taken as
16-byte aligned and the integers a typical launch makes multiples of 16 (strides and hidden sizes of
4096-wide bf16 states) are marked so, which is what lets the compiler use 128-bit accesses.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter

assert "TRITON_INTERPRET" not in os.environ, "unset TRITON_INTERPRET: the interpreter has nothing to compile"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from omnibal_kernels.ops import bucket, patchify, unpad, varlen_metadata, vision_counts  # noqa: E402


def configs():
    # pack / unpack: bf16 hidden states (raw bits as int16) and int64 token ids (hidden 1)
    for name, bits, hidden, itemsize in (("bf16 x 4096", "*i16", 4096, 2), ("int64 ids", "*i64", 1, 8)):
        aligned = ("hidden", "stride_pad_b", "stride_pad_s", "stride_packed_t") if hidden % 16 == 0 else ()
        block_h, block_rows = unpad._tile(hidden, itemsize, unpad.TILE_BYTES, unpad.ROW_BYTES)
        yield (
            f"pack[{name}]",
            unpad._unpad_kernel,
            dict(
                padded_ptr=bits,
                packed_ptr=bits,
                cu_seqlens_ptr="*i32",
                batch="i32",
                padded_len="i32",
                hidden="i32",
                total_tokens="i32",
                search_steps="i32",
                stride_pad_b="i64",
                stride_pad_s="i32",
                stride_packed_t="i32",
            ),
            dict(BLOCK_T=block_rows, BLOCK_H=block_h),
            aligned,
        )
        yield (
            f"unpack[{name}]",
            unpad._pad_kernel,
            dict(
                packed_ptr=bits,
                padded_ptr=bits,
                cu_seqlens_ptr="*i32",
                padded_len="i32",
                hidden="i32",
                total_tokens="i32",
                n_seq_blocks="i32",
                fill_bits="i64",
                stride_packed_t="i32",
                stride_pad_b="i64",
                stride_pad_s="i32",
            ),
            dict(BLOCK_S=block_rows, BLOCK_H=block_h),
            aligned,
        )
    for has_labels in (True, False):
        yield (
            f"varlen_metadata[labels={has_labels}]",
            varlen_metadata._varlen_metadata_kernel,
            dict(
                seq_lens_ptr="*i32",
                labels_ptr="*i64",
                cu_seqlens_ptr="*i32",
                position_ids_ptr="*i64",
                seq_idx_ptr="*i32",
                labels_out_ptr="*i64",
                total_tokens="i32",
                ignore_index="i32",
            ),
            dict(HAS_LABELS=has_labels, BLOCK_B=varlen_metadata.BLOCK_B, BLOCK_T=varlen_metadata.BLOCK_T),
            (),
        )
    yield (
        "bucket_hist",
        bucket._bucket_hist_kernel,
        dict(
            counts_ptr="*i64",
            bnd_ptr="*i64",
            bucket_ptr="*i32",
            rank_ptr="*i32",
            hist_ptr="*i64",
            n="i32",
            num_bnd="i32",
            num_blocks="i32",
        ),
        dict(STEPS=4, BLOCK=bucket.BLOCK),
        (),
    )
    yield (
        "bucket_scatter",
        bucket._bucket_scatter_kernel,
        dict(bucket_ptr="*i32", rank_ptr="*i32", base_ptr="*i64", perm_ptr="*i64", n="i32", num_blocks="i32"),
        dict(BLOCK=bucket.BLOCK),
        (),
    )
    for elem, ptr in ((2, "*i16"), (4, "*i32"), (1, "*u8")):
        yield (
            f"pack_patches[{elem}-byte]",
            patchify._patchify_kernel,
            dict(base_ptr="*i64", meta_ptr="*i64", patch_image_ptr="*i32", out_ptr=ptr, pos_ptr="*i64"),
            dict(
                C=3,
                TP=2,
                PS=14,
                MS=2,
                BLOCK_CT=triton.next_power_of_2(6),
                BLOCK_PP=triton.next_power_of_2(196),
                ELEM=patchify._TL_INT[elem],
            ),
            (),
        )
    for thumbnail in (True, False):
        yield (
            f"internvl_tiles[thumbnail={thumbnail}]",
            vision_counts._internvl_tiles_kernel,
            dict(
                w_ptr="*i64",
                h_ptr="*i64",
                cand_cols_ptr="*i64",
                cand_rows_ptr="*i64",
                cols_ptr="*i64",
                rows_ptr="*i64",
                tiles_ptr="*i64",
                n="i32",
                num_cands="i32",
                image_size="i32",
            ),
            dict(USE_THUMBNAIL=thumbnail, BLOCK=vision_counts.BLOCK),
            (),
        )
    yield (
        "smart_resize",
        vision_counts._smart_resize_kernel,
        dict(
            w_ptr="*i64",
            h_ptr="*i64",
            h_out_ptr="*i64",
            w_out_ptr="*i64",
            n="i32",
            factor="i32",
            min_pixels="i32",
            max_pixels="i32",
        ),
        dict(BLOCK=vision_counts.BLOCK),
        (),
    )


def main(argv: list[str]) -> int:
    arch = int(argv[1]) if len(argv) > 1 else 90
    target = GPUTarget("cuda", arch, 32)
    failed = 0
    for name, kernel, signature, constexprs, aligned_ints in configs():
        signature = {**signature, **{k: "constexpr" for k in constexprs}}
        aligned = [i for i, (arg, kind) in enumerate(signature.items()) if kind.startswith("*") or arg in aligned_ints]
        attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
        try:
            compiled = triton.compile(
                ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs), target=target
            )
            ptx = compiled.asm["ptx"]
            loads = dict(Counter(re.findall(r"ld\.global[\w.:]*", ptx)))
            stores = dict(Counter(re.findall(r"st\.global[\w.:]*", ptx)))
            print(f"ok\t{name}\t{json.dumps(loads)}\t{json.dumps(stores)}")
        except Exception as exc:  # report every kernel, then fail
            failed += 1
            print(f"FAILED\t{name}\t{type(exc).__name__}: {str(exc)[:2000]!r}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
