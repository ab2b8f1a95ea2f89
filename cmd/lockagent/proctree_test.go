package main

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSignalDescendant: run signals its descendants, children and
// grandchildren, and refuses any other process, which a reused pid
// would be.
func TestSignalDescendant(t *testing.T) {
	t.Parallel()
	sh := exec.Command("sh", "-c", "sleep 60 & echo $!; wait")
	out, err := sh.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, sh.Start())
	t.Cleanup(func() { sh.Process.Kill(); sh.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	grandchild, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)

	require.True(t, descends(sh.Process.Pid), "a child")
	require.True(t, descends(grandchild), "a grandchild")
	require.False(t, descends(os.Getppid()), "the parent")
	require.False(t, descends(1), "init")
	require.False(t, descends(os.Getpid()), "itself")

	require.ErrorIs(t, signalDescendant(os.Getppid(), 0), unix.ESRCH)
	require.ErrorIs(t, signalDescendant(1, 0), unix.ESRCH)
	require.Empty(t, signalAll([]int{os.Getppid(), 1}, 0), "refused, not denied")

	// The grandchild's end ends the shell's wait.
	require.NoError(t, signalDescendant(grandchild, syscall.SIGKILL))
	require.NoError(t, sh.Wait())
	require.False(t, descends(sh.Process.Pid), "a reaped child")
	require.ErrorIs(t, signalDescendant(sh.Process.Pid, syscall.SIGKILL), unix.ESRCH)
}
