"""Numbers that matter, named once (layouts, quantization, model geometry)."""

FP8_MAX = 448.0  # largest finite e4m3fn magnitude
SCALE_FLOOR = 1e-4  # MODEL1/V32 tiles: floor of amax/448 before the power-of-two ceiling
INDEXER_AMAX_FLOOR = 1e-4  # indexer K/Q: floor of amax before the power-of-two ceiling

CACHE_ALIGNMENT = 576  # page byte sizes are rounded up to a multiple of this
PAGE_ALIGNMENTS = (512, CACHE_ALIGNMENT)  # the multiples engines pad pages to (vLLM: 576 with fp8_ds_mla, 512 else)

# MODEL1 ("fp8_ds_mla", DSv4) KV cache entry
MODEL1_HEAD_DIM = 512
MODEL1_NOPE_DIM = 448
MODEL1_ROPE_DIM = 64
MODEL1_TILE = 64
MODEL1_DATA_BYTES = 576  # 448 e4m3 + 64 bf16
MODEL1_SCALE_BYTES = 8  # 7 UE8M0 + 1 pad
MODEL1_BYTES_PER_TOKEN = 584

# V32 (DeepSeek-V3.2 FlashMLA) KV cache entry
V32_HEAD_DIM = 576
V32_NOPE_DIM = 512
V32_ROPE_DIM = 64
V32_TILE = 128
V32_BYTES_PER_TOKEN = 656  # 512 e4m3 + 4 fp32 + 64 bf16

# V4.1 fp8 KV cache entry (DeepSeek-V4.1): 512 e4m3 (RoPE dims too) + 16 UE8M0 scales (one per 32 dims)
V41_HEAD_DIM = 512
V41_FP8_TILE = 32
V41_FP8_DATA_BYTES = 512
V41_FP8_SCALE_BYTES = 16
V41_FP8_BYTES_PER_TOKEN = 528

# V4.1 fp4 KV cache entry (extra cache only): 256 bytes of e2m1 pairs + 32 e4m3 scales (one per 16 dims)
V41_FP4_TILE = 16
V41_FP4_DATA_BYTES = 256
V41_FP4_SCALE_BYTES = 32
V41_FP4_BYTES_PER_TOKEN = 288
E2M1_MAX = 6.0  # largest e2m1 magnitude
FP4_SCALE_MIN = 2.0**-9  # floor of a V4.1 fp4 tile scale: the smallest e4m3 magnitude
V41_PAGE_ALIGNMENT = 512  # page-split V4.1 pages are padded to a multiple of this (vLLM, SGLang, FlashMLA 09-10)

# Indexer K cache entry
INDEXER_HEAD_DIM = 128
INDEXER_ROPE_DIM = 64
INDEXER_K_BYTES_PER_ENTRY = 132  # 128 e4m3 + fp32 scale

ROPE_DIM = 64
SLIDING_WINDOW = 128

# Paged-cache geometry of a DeepSeek-V4 layer (tokens per block of each cache group)
SWA_BLOCK_SIZE = 64  # SWA cache pages hold 64 raw tokens
COMPRESSED_LOGICAL_BLOCK = 256  # compressed/indexer block tables count 256-token logical blocks
C4_RATIO = 4  # C4A (CSA) layers: one compressed entry per 4 tokens, with the indexer
C128_RATIO = 128  # C128A (HCA) layers: one compressed entry per 128 tokens, all attended

# MXFP4 indexer K entry (DeepSeek-V4.1): 64 bytes of e2m1 codes (dim 2i in the low nibble of byte i) + 4 UE8M0
# scales (one per 32 dims); pages hold block_size code rows, then block_size scale rows
INDEXER_MXFP4_BLOCK = 32
INDEXER_K_FP4_DATA_BYTES = INDEXER_HEAD_DIM // 2
INDEXER_K_FP4_SCALE_BYTES = INDEXER_HEAD_DIM // INDEXER_MXFP4_BLOCK
INDEXER_K_FP4_BYTES_PER_ENTRY = 68
MXFP4_AMAX_FLOOR = 6.0 * 2.0**-126  # a block's amax floor: its exponent is then at least -126
