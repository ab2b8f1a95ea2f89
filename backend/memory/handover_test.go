package memory

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/backend"
)

// TestSnapshotRestore: a backend restored from a snapshot holds what the
// first held, queues its tickets in the same order, expires them when the
// first would have (less the time in between, never later), and goes on
// with the same epoch: the next token is the next of the sequence, and
// the epoch file is not bumped.
func TestSnapshotRestore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "state")
		a, err := Open(dir)
		require.NoError(t, err)
		ctx := t.Context()
		acq := func(b *Backend, name, id, ticket string, mode backend.Mode, ttl time.Duration) (uint64, error) {
			g, err := b.Acquire(ctx, backend.AcquireRequest{Name: name, LeaseID: id, Mode: mode, TTL: ttl, Ticket: ticket, Meta: "m-" + id, Host: "h"})
			return g.Token, err
		}
		tok, err := acq(a, "x", "h1", "", backend.Exclusive, 10*time.Second)
		require.NoError(t, err)
		_, err = acq(a, "x", "w1", "t1", backend.Exclusive, 4*time.Second)
		require.ErrorIs(t, err, backend.ErrHeld)
		_, err = acq(a, "x", "w2", "t2", backend.Shared, 4*time.Second)
		require.ErrorIs(t, err, backend.ErrHeld)
		_, err = acq(a, "s", "r1", "", backend.Shared, time.Minute)
		require.NoError(t, err)

		time.Sleep(time.Second)
		st, err := a.Snapshot(time.Now())
		require.NoError(t, err)
		raw, err := json.Marshal(st)
		require.NoError(t, err)
		var back State
		require.NoError(t, json.Unmarshal(raw, &back))
		require.NoError(t, a.Close())

		time.Sleep(500 * time.Millisecond) // the handover
		b, err := Restore(dir, back, 500*time.Millisecond)
		require.NoError(t, err)
		defer b.Close()
		info, err := b.Inspect(ctx, "x")
		require.NoError(t, err)
		require.Len(t, info.Holders, 1)
		require.Equal(t, "h1", info.Holders[0].LeaseID)
		require.Equal(t, tok, info.Holders[0].Token)
		require.Equal(t, "m-h1", info.Holders[0].Meta)
		require.Equal(t, 8500*time.Millisecond, info.Holders[0].ExpiresIn, "what remained at the snapshot, less the handover")
		require.Equal(t, 2, info.Queued)
		epoch, err := readEpoch(dir)
		require.NoError(t, err)
		require.Equal(t, back.Epoch, epoch, "no new epoch")

		// The queue keeps its order: w1 is at the head once h1 goes.
		require.NoError(t, b.Release(ctx, backend.LeaseKey{Name: "x", LeaseID: "h1", Mode: backend.Exclusive}))
		_, err = acq(b, "x", "w2", "t2", backend.Shared, 4*time.Second)
		require.ErrorIs(t, err, backend.ErrHeld, "w2 came after w1")
		next, err := acq(b, "x", "w1", "t1", backend.Exclusive, 4*time.Second)
		require.NoError(t, err)
		require.Equal(t, back.Epoch<<seqBits|(back.Seq+1), next, "the next token of the same sequence")

		// The shared holder expires when it would have.
		time.Sleep(time.Minute - 1500*time.Millisecond - time.Nanosecond)
		info, err = b.Inspect(ctx, "s")
		require.NoError(t, err)
		require.Len(t, info.Holders, 1)
		time.Sleep(time.Nanosecond)
		info, err = b.Inspect(ctx, "s")
		require.NoError(t, err)
		require.Empty(t, info.Holders)
	})
}
