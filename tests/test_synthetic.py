"""The synthetic distribution classes: deterministic for a seed, valid loads, their documented shapes."""

import numpy as np
import pytest

from omnibal_kernels.synthetic import DISTRIBUTIONS, synthetic_lengths, synthetic_samples

# Loads of two of the first seven classes, drawn before the held-out classes were added.
TEXT_LONG_TAIL_1000_SUM = 1_611_564
VIDEO_MIX_1000_VIT_SUM = 5_669_992


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


@pytest.mark.parametrize("kind", sorted(DISTRIBUTIONS))
def test_vit_seqlens_are_csr_and_sum_to_the_vit_load(kind):
    drawn = synthetic_samples(kind, 3_000, seed=4)
    lengths = synthetic_lengths(kind, 3_000, seed=4)
    np.testing.assert_array_equal(drawn.lengths.vit, lengths.vit)
    np.testing.assert_array_equal(drawn.lengths.llm, lengths.llm)
    offsets, seqlens = drawn.vit_seqlens_offsets, drawn.vit_seqlens
    assert offsets.dtype == np.int64 and seqlens.dtype == np.int64
    assert offsets.shape == (3_001,) and offsets[0] == 0 and offsets[-1] == seqlens.size
    assert (np.diff(offsets) >= 0).all() and (seqlens > 0).all()
    sums = np.zeros(3_000, np.int64)
    np.add.at(sums, np.repeat(np.arange(3_000), np.diff(offsets)), seqlens)
    np.testing.assert_array_equal(sums, lengths.vit)
    again = synthetic_samples(kind, 3_000, seed=4)
    np.testing.assert_array_equal(again.vit_seqlens, seqlens)


def test_vit_seqlens_follow_the_vision_towers():
    assert synthetic_samples("text_long_tail", 2_000).vit_seqlens.size == 0
    for kind in ("single_image_short_text", "many_images_long_text", "half_text_half_image", "bundled"):
        drawn = synthetic_samples(kind, 2_000)  # InternVL: one sequence per tile
        assert (drawn.vit_seqlens == 1).all()
        np.testing.assert_array_equal(np.diff(drawn.vit_seqlens_offsets), drawn.lengths.vit)
    patches = synthetic_samples("patch_multires", 5_000)
    per_sample = np.diff(patches.vit_seqlens_offsets)
    assert per_sample.max() == 3 and (per_sample == 0).any()  # 0-3 images, one sequence each
    # an image's patches: an even grid (2x2 merge) of at most max_pixels / 14**2
    assert (patches.vit_seqlens % 4 == 0).all() and patches.vit_seqlens.max() <= 28 * 28 * 1280 // 14**2
    video = synthetic_samples("video_mix", 5_000)
    groups = np.diff(video.vit_seqlens_offsets)
    # a sample is one image (1 sequence) or a video of 8-64 frames (4-32 frame groups of equal size)
    assert set(np.unique(groups)) <= {1} | set(range(4, 33)) and (groups >= 4).mean() > 0.2
    for i in np.flatnonzero(groups >= 4)[:50]:
        frames = video.vit_seqlens[video.vit_seqlens_offsets[i] : video.vit_seqlens_offsets[i + 1]]
        assert (frames == frames[0]).all()
    with pytest.raises(ValueError, match="kind must be one of"):
        synthetic_samples("no_such_kind", 10)


def test_shapes_of_the_held_out_classes():
    documents = synthetic_samples("interleaved_documents", 5_000)
    images = np.diff(documents.vit_seqlens_offsets)
    assert images.min() == 2 and images.max() == 8  # one ViT sequence per image
    assert (documents.lengths.llm - documents.lengths.vit // 4 >= 200).all()  # long text beside the images
    text = synthetic_lengths("long_text_128k", 20_000)
    assert (text.vit == 0).all() and text.llm.max() <= 131_072 and text.llm.max() > 100_000
    assert 0.03 < float((text.llm >= 16_384).mean()) < 0.08  # the 2% documents and the body's tail
    clusters = synthetic_lengths("clustered_mix", 20_000)
    pages = clusters.vit > 0
    assert 0.25 < float(pages.mean()) < 0.35 and clusters.vit[pages].min() >= 7 and clusters.vit.max() == 13
    highres = synthetic_samples("patch_highres", 5_000)
    assert (np.diff(highres.vit_seqlens_offsets) == 1).all() and highres.vit_seqlens.max() <= 4096 * 4
    video = synthetic_samples("video_long", 5_000)
    groups = np.diff(video.vit_seqlens_offsets)
    assert groups.min() >= 4 and groups.max() <= 256 and (groups > 64).any()  # 8-512 frames, 2 per group


def test_the_first_seven_classes_draw_as_before_new_ones_were_added():
    # each class has its own random stream: adding a class leaves the others' draws as they were
    assert int(synthetic_lengths("text_long_tail", 1_000, seed=0).llm.sum()) == TEXT_LONG_TAIL_1000_SUM
    assert int(synthetic_lengths("video_mix", 1_000, seed=0).vit.sum()) == VIDEO_MIX_1000_VIT_SUM
