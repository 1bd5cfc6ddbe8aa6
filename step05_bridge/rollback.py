"""What a verify step takes back when the model rejects guesses: the counter, then the blocks only they used.

The verify forward computed K/V for a sequence's pending token and all its guesses, so its `num_computed_tokens`
moved past them (`Sequence.advance`). Once `verify` knows how many guesses were rejected, two moves undo what they
claimed, in this order, before the cache manager hears of the step (`on_computed`):

1. `rollback(seq, num_rejected)`: the counter goes back over the rejected positions. Their slots still hold K/V of
   tokens the sequence does not have; the next forward overwrites them, and nothing reads them before that.
2. `release_rejected_blocks(kv, seq)`: the cache manager keeps the blocks the verified tokens need (the computed
   ones and the token sampled last, which runs next step) and releases the rest, tail first.

Because `on_computed` comes after both, no design ever published a block, hash or tree node past the counter: every
block released here is the sequence's own, whatever the cache (chapters 2-5). vLLM keeps such blocks for the next
guesses; giving them back keeps the course's rule that a block table holds what its tokens need.
"""
from __future__ import annotations

from step02_paged.cache_manager import CacheManager
from step02_paged.geometry import cdiv
from step02_paged.sequence import Sequence


def rollback(seq: Sequence, num_rejected: int) -> None:
    """Take the last `num_rejected` computed positions of `seq` back. Called after `advance` and before the step's
    tokens are appended, when the guesses the forward ran are the computed positions past the sequence's tokens; a
    count that is not one of them (negative, too many, not an int) raises ValueError and changes nothing."""
    # BEGIN SOLUTION task5.rollback points=2
    past = seq.num_computed_tokens - seq.num_tokens_with_in_flight  # computed positions beyond the tokens
    if not isinstance(num_rejected, int) or isinstance(num_rejected, bool) or not 0 <= num_rejected <= max(past, 0):
        raise ValueError(f"sequence {seq.seq_id}: cannot roll back {num_rejected!r} tokens; {max(past, 0)} "
                         "computed positions hold guesses")
    seq.num_computed_tokens -= num_rejected
    # END SOLUTION


def release_rejected_blocks(kv: CacheManager, seq: Sequence) -> None:
    """After `rollback`: keep the blocks `seq`'s verified tokens need (its computed tokens and the one it sampled
    last) and release the rest to `kv`'s block manager, tail first, through `Sequence.truncate_blocks`."""
    # BEGIN SOLUTION task5.rollback points=2
    keep = cdiv(seq.num_computed_tokens + 1, kv.block_size)
    kv.block_manager.release(seq.truncate_blocks(keep)[::-1])
    # END SOLUTION
