package socketapi_test

import (
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAcceptSurvivesRunningOutOfDescriptors: when accept fails for want of
// file descriptors, the agent keeps its sessions and serves again as soon
// as descriptors are free.
func TestAcceptSurvivesRunningOutOfDescriptors(t *testing.T) {
	ta := startAgent(t)
	keep := ta.raw(t)
	keep.ok(`{"op":"acquire","name":"precious"}`)

	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	low := lim
	low.Cur = uint64(len(fds) + 20)
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low))
	restored := false
	restore := func() {
		if !restored {
			restored = true
			require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim))
		}
	}
	defer restore()

	// Connect until the process has no descriptor left: the agent's accept
	// fails, or the dial itself does.
	var extra []net.Conn
	for i := 0; i < 40; i++ {
		c, err := net.DialTimeout("unix", ta.path, time.Second)
		if err != nil {
			break
		}
		extra = append(extra, c)
	}
	for _, c := range extra {
		c.Close()
	}
	restore()

	keep.ok(`{"op":"ping"}`)
	require.Eventually(t, func() bool { return pings(ta.path) }, 5*time.Second, 10*time.Millisecond, "the agent serves new connections again")
	assert.Equal(t, false, ta.raw(t).ok(`{"op":"acquire","name":"precious"}`)["acquired"], "the lock was kept")
}
