package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestRunCtrlC: run on a terminal, in its foreground, the way a shell
// starts it. A Ctrl-C goes from the terminal to the whole foreground
// process group, run and its command alike: the command gets it once, not
// a second time from run (to many tools a second Ctrl-C means "abort at
// once").
func TestRunCtrlC(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	e.start(t)
	c := dialAgent(t, e.socket, "e2e-test")

	ptmx, pts := openPTY(t)
	// The command takes its SIGINTs one by one, and tells who sent each
	// (the kernel, for the terminal: pid 0); it ends half a second after
	// the first, with their count as its status.
	script := `
import signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
print("ready", flush=True)
senders, end = [], None
while end is None or time.monotonic() < end:
    info = signal.sigtimedwait([signal.SIGINT], 0.05)
    if info is not None:
        senders.append(info.si_pid)
        end = end or time.monotonic() + 0.5
print("senders", senders, flush=True)
sys.exit(len(senders))
`
	cmd := exec.Command(lockagentBin, "run", "run/tty", "--", "python3", "-c", script)
	cmd.Env = append(baseEnv(), e.clientEnv()...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pts, pts, pts
	// A session of its own, with the terminal as its controlling one: run
	// leads the terminal's foreground process group, as a job of a shell.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	require.NoError(t, cmd.Start())
	pts.Close()
	var waitErr error
	done := make(chan struct{})
	go func() {
		waitErr = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	var out syncOutput
	go out.copyFrom(ptmx)

	out.waitFor(t, "ready")
	require.Len(t, inspect(t, c, "run/tty").Holders, 1, "the command runs under the lock")
	_, err := ptmx.Write([]byte{0x03}) // Ctrl-C
	require.NoError(t, err)
	select {
	case <-done:
		err = waitErr
	case <-time.After(exitTimeout):
		t.Fatalf("run did not end after Ctrl-C; output:\n%s", out.String())
	}
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, 1, ee.ExitCode(), "the command's status, its SIGINT count; output:\n%s", out.String())
	require.Contains(t, out.String(), "senders [0]", "the terminal's SIGINT")
}

// openPTY opens a pseudo-terminal: its master, and its slave, which no
// process has yet as its controlling terminal.
func openPTY(t *testing.T) (ptmx, pts *os.File) {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { ptmx.Close() })
	require.NoError(t, unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0))
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	require.NoError(t, err)
	pts, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { pts.Close() })
	return ptmx, pts
}

// syncOutput collects what a terminal's master reads.
type syncOutput struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *syncOutput) copyFrom(f *os.File) {
	b := make([]byte, 4096)
	for {
		n, err := f.Read(b)
		o.mu.Lock()
		o.buf.Write(b[:n])
		o.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (o *syncOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

func (o *syncOutput) waitFor(t *testing.T, s string) {
	t.Helper()
	eventually(t, exitTimeout, fmt.Sprintf("%q on the terminal", s), func() bool { return strings.Contains(o.String(), s) })
}

// TestRunEndsWithoutTheAgent: once the command has ended, run asks the
// agent to release the lock, but waits for an agent that does not answer
// (here, stopped) no longer than byeTimeout, and exits with the command's
// status.
func TestRunEndsWithoutTheAgent(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	a := e.start(t)
	flag := filepath.Join(t.TempDir(), "end")
	p := startProc(t, "run", e.clientEnv(), lockagentBin, "run", "run/stopped", "--",
		"sh", "-c", fmt.Sprintf(`echo ready; while [ ! -e %q ]; do sleep 0.02; done; exit 3`, flag))
	p.waitOutput(t, "ready", exitTimeout)
	a.signal(t, syscall.SIGSTOP)
	defer a.signal(t, syscall.SIGCONT)
	require.NoError(t, os.WriteFile(flag, nil, 0o600))
	start := time.Now()
	require.Equal(t, 3, p.wait(t, byeTimeout+exitTimeout), "the command's status")
	require.GreaterOrEqual(t, time.Since(start), byeTimeout-time.Second, "run asked the agent first")
}

// TestRunSignalBeforeTheCommand: until the command runs, a signal stops
// run (128+N), also while it waits on an agent that does not answer: its
// hello (a wedged agent, or systemd holding the socket of one that does
// not start), or a campaign's answer with -elect.
func TestRunSignalBeforeTheCommand(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		answer string // the op the fake agent answers; it never answers the others
		args   []string
	}{
		{"hello", "", []string{"run", "sig/hello", "--", "true"}},
		{"campaign", "hello", []string{"run", "-elect", "sig/campaign", "--", "true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			socket := filepath.Join(t.TempDir(), "deaf.sock")
			ln, err := net.Listen("unix", socket)
			require.NoError(t, err)
			defer ln.Close()
			asked := make(chan string, 4) // the ops the fake agent read
			go func() {
				nc, err := ln.Accept()
				if err != nil {
					return
				}
				defer nc.Close()
				sc := bufio.NewScanner(nc)
				for sc.Scan() {
					var req struct {
						ID any    `json:"id"`
						Op string `json:"op"`
					}
					if json.Unmarshal(sc.Bytes(), &req) != nil {
						return
					}
					asked <- req.Op
					if req.Op == tc.answer {
						id, _ := json.Marshal(req.ID)
						fmt.Fprintf(nc, `{"id":%s,"ok":true}`+"\n", id)
					}
				}
			}()
			p := startProc(t, "run", []string{"LOCKAGENT_SOCKET=" + socket}, lockagentBin, tc.args...)
			for op := tc.answer; op == tc.answer; {
				select {
				case op = <-asked:
				case <-time.After(exitTimeout):
					t.Fatal("run never asked the agent")
				}
			}
			p.signal(t, syscall.SIGTERM)
			require.Equal(t, 128+int(syscall.SIGTERM), p.wait(t, exitTimeout), "run's exit status")
		})
	}
}
