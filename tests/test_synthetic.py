"""The synthetic distribution classes: deterministic for a seed, valid loads, their documented shapes."""
import numpy as np
import pytest

from omnibal_kernels.synthetic import DISTRIBUTIONS, synthetic_lengths


@pytest.mark.parametrize("kind", sorted(DISTRIBUTIONS))
def test_same_seed_same_loads_other_seed_other_loads(kind):
    a = synthetic_lengths(kind, 2_000, seed=1)
    b = synthetic_lengths(kind, 2_000, seed=1)
    c = synthetic_lengths(kind, 2_000, seed=2)
    assert len(a) == 2_000
    np.testing.assert_array_equal(a.vit, b.vit)
    np.testing.assert_array_equal(a.llm, b.llm)
    assert not np.array_equal(a.llm, c.llm)
    assert (a.llm > 0).all() and (a.vit >= 0).all()


def test_shapes_of_the_classes():
    assert (synthetic_lengths("text_long_tail", 5_000).vit == 0).all()
    half = synthetic_lengths("half_text_half_image", 20_000)
    assert 0.45 < float((half.vit == 0).mean()) < 0.55
    single = synthetic_lengths("single_image_short_text", 5_000)
    assert single.vit.min() >= 1 and single.vit.max() <= 13
    # Image tokens are part of the LLM load: 256 per InternVL tile, a quarter of the Qwen2-VL patches.
    assert (single.llm >= 256 * single.vit).all()
    patches = synthetic_lengths("patch_multires", 5_000)
    assert (patches.llm >= patches.vit // 4).all() and patches.vit.max() > 1_000
    assert len(synthetic_lengths("bundled", None)) == 70_706


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_arguments_are_clear(bad):
    with pytest.raises(ValueError, match="n must be a positive integer"):
        synthetic_lengths("text_long_tail", bad)
    with pytest.raises(ValueError, match="kind must be one of"):
        synthetic_lengths("no_such_kind", 10)
    with pytest.raises(ValueError, match="n=None"):
        synthetic_lengths("video_mix", None)
