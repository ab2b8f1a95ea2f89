package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

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

// TestSignalWithoutPidfd: where pidfd_open is refused (EPERM, as sandboxes
// refuse the system calls they do not know), run still signals its
// descendants, after the same check. A helper process refuses itself the
// call with a seccomp filter, which would not do in the test process.
func TestSignalWithoutPidfd(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), helperEnv+"=signal-without-pidfd")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "pidfd_open: operation not permitted; the child: signal: terminated\n", string(out))
}

// signalWithoutPidfd is the helper of TestSignalWithoutPidfd: it refuses
// itself pidfd_open, sends SIGTERM to a child with signalDescendant, and
// prints how the child ended.
func signalWithoutPidfd() int {
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // the system call's number
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.SYS_PIDFD_OPEN},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Println("no_new_privs:", err)
		return 1
	}
	const setModeFilter, tsync = 1, 1
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, setModeFilter, tsync, uintptr(unsafe.Pointer(&prog))); e != 0 {
		fmt.Println("seccomp:", e)
		return 1
	}
	_, err := unix.PidfdOpen(os.Getpid(), 0)
	fmt.Print("pidfd_open: ", err, "; ")
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		fmt.Println(err)
		return 1
	}
	if err := signalDescendant(child.Process.Pid, syscall.SIGTERM); err != nil {
		fmt.Println("signalDescendant:", err)
		child.Process.Kill()
	}
	err = child.Wait()
	fmt.Println("the child:", err)
	return 0
}
