package memory

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/backend/backendtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// mustOpen opens a backend in dir and closes it when t ends.
func mustOpen(t *testing.T, dir string) *Backend {
	t.Helper()
	b, err := Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			assert.ErrorIs(t, err, backend.ErrClosed)
		}
	})
	return b
}

func request(name, lease string, ttl time.Duration) backend.AcquireRequest {
	return backend.AcquireRequest{Name: name, LeaseID: lease, Mode: backend.Exclusive, TTL: ttl}
}

func mustAcquire(t *testing.T, b *Backend, req backend.AcquireRequest) uint64 {
	t.Helper()
	g, err := b.Acquire(t.Context(), req)
	require.NoError(t, err)
	return g.Token
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(data), 0o600))
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(data)
}

// requireOnlyEpochFile requires dir to hold the epoch file and nothing else:
// no temporary file is left behind.
func requireOnlyEpochFile(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{epochFile}, names)
}

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend { return mustOpen(t, t.TempDir()) })
}

// TestConformanceExhausted: the memory backend's tokens run out for
// every name at once, when the last epoch's sequence does.
func TestConformanceExhausted(t *testing.T) {
	backendtest.RunExhausted(t, func(t *testing.T) (backend.Backend, func(string)) {
		b := mustOpen(t, t.TempDir())
		return b, func(string) {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.epoch, b.seq = epochLimit-1, seqMax
		}
	})
}

func TestName(t *testing.T) {
	assert.Equal(t, "memory", mustOpen(t, t.TempDir()).Name())
}

func TestTokensIncreaseAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	var last uint64
	for run := range 3 {
		b, err := Open(dir)
		require.NoError(t, err)
		for i := range 3 {
			req := request(fmt.Sprintf("n%d", i), "a", time.Minute)
			tok := mustAcquire(t, b, req)
			require.Greater(t, tok, last, "run %d", run)
			last = tok
			require.NoError(t, b.Release(t.Context(), backend.LeaseKey{Name: req.Name, LeaseID: "a"}))
		}
		require.NoError(t, b.Close())
	}
	requireOnlyEpochFile(t, dir)
	assert.Equal(t, "3\n", readFile(t, filepath.Join(dir, epochFile)))
}

func TestOpenCreatesStateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "lockagent")
	b := mustOpen(t, dir)
	require.Equal(t, uint64(1)<<seqBits|1, mustAcquire(t, b, request("n", "a", time.Minute)))

	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	fi, err = os.Stat(filepath.Join(dir, epochFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	requireOnlyEpochFile(t, dir)
}

// TestOpenChecksTheEpochFile: the epoch file is refused, and left as it is,
// unless it holds a decimal number from 0 to epochLimit-2, which leaves an
// epoch to move to; every number past that, however large, is refused the
// same way, as tokens exhausted, and the message of a corrupt file names
// the numbers it may hold.
func TestOpenChecksTheEpochFile(t *testing.T) {
	last := strconv.FormatUint(epochLimit-2, 10) // 2097150, the largest usable
	for _, tc := range []struct {
		data  string
		epoch uint64 // the epoch of the run; 0: refused
		err   error  // nil: corrupt
	}{
		{data: "0\n", epoch: 1},
		{data: "7", epoch: 8},
		{data: "0007\n", epoch: 8},
		{data: last + "\n", epoch: epochLimit - 1},
		{data: "2097151\n", err: backend.ErrTokensExhausted}, // 2^21-1, one above the largest usable
		{data: "2097152\n", err: backend.ErrTokensExhausted}, // 2^21
		{data: "4294967296\n", err: backend.ErrTokensExhausted},
		{data: "18446744073709551614\n", err: backend.ErrTokensExhausted}, // 2^64-2
		{data: "18446744073709551615\n", err: backend.ErrTokensExhausted}, // 2^64-1, which wrapped to 0
		{data: "18446744073709551616\n", err: backend.ErrTokensExhausted}, // 2^64
		{data: "99999999999999999999999\n", err: backend.ErrTokensExhausted},
		{data: strings.Repeat("9", 1000) + "\n", err: backend.ErrTokensExhausted},
		{data: ""},
		{data: "\n"},
		{data: "abc\n"},
		{data: "-1\n"},
		{data: "-0\n"},
		{data: "-18446744073709551615\n"},
		{data: "+1\n"},
		{data: "+" + last + "\n"},
		{data: " 1\n"},
		{data: "1 \n"},
		{data: "\t1\n"},
		{data: "1\r\n"},
		{data: "1 2\n"},
		{data: "1\n\n"},
		{data: "0x10\n"},
		{data: "1_000\n"},
		{data: "1e3\n"},
		{data: strings.Repeat("x", 100000)},
	} {
		t.Run(strconv.Quote(tc.data[:min(len(tc.data), 32)]), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, epochFile)
			writeFile(t, path, tc.data)
			b, err := Open(dir)
			if tc.epoch != 0 {
				require.NoError(t, err)
				t.Cleanup(func() { b.Close() })
				tok := mustAcquire(t, b, request("n", "a", time.Minute))
				assert.Equal(t, tc.epoch<<seqBits|1, tok, "the first token")
				assert.Less(t, tok, uint64(backend.MaxToken))
				assert.Equal(t, strconv.FormatUint(tc.epoch, 10)+"\n", readFile(t, path))
				return
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, path)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				assert.ErrorContains(t, err, "from 0 to "+last)
			} else {
				assert.NotErrorIs(t, err, backend.ErrTokensExhausted)
				assert.ErrorContains(t, err, "corrupt")
				assert.ErrorContains(t, err, "up to "+last, "the numbers it may hold")
				assert.Less(t, len(err.Error()), 512, "a large file is not copied into the message")
			}
			assert.Equal(t, tc.data, readFile(t, path), "the file was changed")
			requireOnlyEpochFile(t, dir)
		})
	}
}

func TestEpochRollsOver(t *testing.T) {
	dir := t.TempDir()
	b := mustOpen(t, dir)
	b.seq = seqMax - 1
	last := mustAcquire(t, b, request("a", "a", time.Minute))
	require.Equal(t, uint64(1)<<seqBits|seqMax, last)

	tok := mustAcquire(t, b, request("b", "b", time.Minute))
	require.Equal(t, uint64(2)<<seqBits|1, tok, "first token of the next epoch")
	assert.Equal(t, "2\n", readFile(t, filepath.Join(dir, epochFile)), "the new epoch is persisted")
	requireOnlyEpochFile(t, dir)
}

func TestTokensStayBelowMaxToken(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, epochFile)
	writeFile(t, path, strconv.FormatUint(epochLimit-2, 10)+"\n")
	b := mustOpen(t, dir)
	b.seq = seqMax - 1

	tok := mustAcquire(t, b, request("a", "a", time.Minute))
	require.Less(t, tok, uint64(backend.MaxToken))
	require.Equal(t, uint64(backend.MaxToken-1), tok, "the largest token")

	_, err := b.Acquire(t.Context(), request("b", "b", time.Minute))
	require.ErrorIs(t, err, backend.ErrTokensExhausted)
	assert.ErrorContains(t, err, path)
	info, err := b.Inspect(t.Context(), "b")
	require.NoError(t, err)
	assert.Empty(t, info.Holders)
	assert.Zero(t, info.LastToken)
	assert.Equal(t, strconv.FormatUint(epochLimit-1, 10)+"\n", readFile(t, path))

	// The next run finds the last epoch used up, the same way.
	_, err = Open(dir)
	require.ErrorIs(t, err, backend.ErrTokensExhausted)
}

func TestInvalidTTL(t *testing.T) {
	b := mustOpen(t, t.TempDir())
	_, err := b.Acquire(t.Context(), request("a", "a", 0))
	require.ErrorContains(t, err, "ttl")
	assert.NotErrorIs(t, err, backend.ErrHeld)

	mustAcquire(t, b, request("a", "a", time.Minute))
	errs := b.Renew(t.Context(), []backend.RenewRequest{{LeaseKey: backend.LeaseKey{Name: "a", LeaseID: "a"}, TTL: -time.Second}})
	require.ErrorContains(t, errs[0], "ttl")
	assert.NotErrorIs(t, errs[0], backend.ErrNotHeld, "an invalid renewal says nothing of the lease")
}

// TestLeaseIDInOtherModeIsNoOtherSentinel: ErrOtherMode, a caller's bug,
// is neither a conflict worth waiting on nor a lease gone.
func TestLeaseIDInOtherModeIsNoOtherSentinel(t *testing.T) {
	b := mustOpen(t, t.TempDir())
	mustAcquire(t, b, request("a", "a", time.Minute))
	req := request("a", "a", time.Minute)
	req.Mode = backend.Shared
	_, err := b.Acquire(t.Context(), req)
	require.ErrorIs(t, err, backend.ErrOtherMode)
	for _, sentinel := range []error{backend.ErrHeld, backend.ErrNotHeld, backend.ErrForeignKey, backend.ErrTokensExhausted, backend.ErrUnavailable, backend.ErrClosed} {
		assert.NotErrorIs(t, err, sentinel)
	}
}

// TestExpiry checks, on synctest's clock, that a lease dies exactly at its
// TTL, that RetryIn says when, and that pruning it notifies watchers.
func TestExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, t.TempDir())
		ch, cancel, err := b.Watch(t.Context(), "n", "")
		require.NoError(t, err)
		defer cancel()
		a := request("n", "a", 10*time.Second)
		mustAcquire(t, b, a)

		time.Sleep(10*time.Second - time.Nanosecond)
		_, err = b.Acquire(t.Context(), request("n", "c", time.Second))
		var held *backend.HeldError
		require.ErrorAs(t, err, &held)
		require.Equal(t, time.Nanosecond, held.RetryIn)
		require.Empty(t, ch)

		time.Sleep(held.RetryIn)
		mustAcquire(t, b, request("n", "c", time.Second))
		require.Len(t, ch, 1, "pruning the expired holder notifies")
		errs := b.Renew(t.Context(), []backend.RenewRequest{{LeaseKey: backend.LeaseKey{Name: "n", LeaseID: "a"}, TTL: time.Minute}})
		require.ErrorIs(t, errs[0], backend.ErrNotHeld)
	})
}

func TestSweepBoundsTable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, t.TempDir())
		b.minSweep, b.sweepAt = 100, 100

		held := map[string]uint64{}
		for i := range 10 {
			name := fmt.Sprintf("held/%d", i)
			held[name] = mustAcquire(t, b, request(name, "h", time.Hour))
		}
		// Names left to expire are never touched again.
		for i := range 50 {
			mustAcquire(t, b, request(fmt.Sprintf("expired/%d", i), "e", time.Second))
		}
		time.Sleep(time.Second)
		for i := range 1000 {
			name := fmt.Sprintf("free/%d", i)
			mustAcquire(t, b, request(name, "f", time.Minute))
			require.NoError(t, b.Release(t.Context(), backend.LeaseKey{Name: name, LeaseID: "f"}))
			require.LessOrEqual(t, len(b.names), 100)
		}
		for name, tok := range held {
			info, err := b.Inspect(t.Context(), name)
			require.NoError(t, err)
			require.Len(t, info.Holders, 1, name)
			require.Equal(t, tok, info.Holders[0].Token, name)
			require.Equal(t, tok, info.LastToken, name)
		}
		_, ok := b.names["expired/0"]
		require.False(t, ok, "an expired name was not swept")

		// Past the floor, the table grows with the names held: none is
		// dropped, and the next sweep waits for the table to double.
		for i := range 300 {
			mustAcquire(t, b, request(fmt.Sprintf("more/%d", i), "h", time.Hour))
		}
		require.Len(t, b.names, 310)
		require.GreaterOrEqual(t, b.sweepAt, 310)
	})
}

func TestCloseWakesWatchers(t *testing.T) {
	b, err := Open(t.TempDir())
	require.NoError(t, err)
	ch, cancel, err := b.Watch(t.Context(), "n", "")
	require.NoError(t, err)
	require.NoError(t, b.Close())
	require.Len(t, ch, 1)
	cancel()
	require.ErrorIs(t, b.Close(), backend.ErrClosed)
}
