package socketapi

import (
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestIdlePollerFreesAfterABurst: free runs once freeAfterParks sockets
// have parked and then none for freeDelay; not for fewer parks, not while
// parking goes on, not twice within freeEvery, and not after close.
func TestIdlePollerFreesAfterABurst(t *testing.T) {
	p, err := newIdlePoller(func() {})
	require.NoError(t, err)
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer syscall.Close(fds[0])
	defer syscall.Close(fds[1])
	synctest.Test(t, func(t *testing.T) {
		var frees atomic.Int32
		p.free = func() { frees.Add(1) }
		park := func(n int) {
			for range n {
				require.True(t, p.park(int32(fds[0]), func() {}))
				p.unpark(int32(fds[0]))
			}
		}
		park(freeAfterParks - 1)
		time.Sleep(10 * freeDelay)
		synctest.Wait()
		assert.Zero(t, frees.Load(), "fewer parks than a burst")

		park(1)
		time.Sleep(freeDelay / 2)
		park(1)
		time.Sleep(freeDelay - time.Millisecond)
		synctest.Wait()
		assert.Zero(t, frees.Load(), "parking went on")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		assert.Equal(t, int32(1), frees.Load(), "a pause after the burst")

		park(freeAfterParks - 1)
		time.Sleep(10 * freeDelay)
		synctest.Wait()
		assert.Equal(t, int32(1), frees.Load(), "parks count again from zero")

		park(1) // a burst 11 s after the last run
		time.Sleep(freeEvery - 12*freeDelay)
		synctest.Wait()
		assert.Equal(t, int32(1), frees.Load(), "within a minute of the last run")
		time.Sleep(2 * freeDelay)
		synctest.Wait()
		assert.Equal(t, int32(2), frees.Load(), "a minute after the last run")

		park(freeAfterParks)
		p.close()
		time.Sleep(10 * freeDelay)
		synctest.Wait()
		assert.Equal(t, int32(2), frees.Load(), "closed before the pause ended")
		assert.False(t, p.park(int32(fds[0]), func() {}), "closed")
	})
}

// TestIdlePollerWithoutFree: without a function to call, a burst of parks
// sets no timer.
func TestIdlePollerWithoutFree(t *testing.T) {
	p, err := newIdlePoller(nil)
	require.NoError(t, err)
	defer p.close()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer syscall.Close(fds[0])
	defer syscall.Close(fds[1])
	for range freeAfterParks + 1 {
		require.True(t, p.park(int32(fds[0]), func() {}))
		p.unpark(int32(fds[0]))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	assert.Nil(t, p.freeTimer)
	assert.Zero(t, p.parks)
}
