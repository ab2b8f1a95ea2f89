package main

// Running the docs' commands as a reader does: every command shown with
// its output, in the doc's order, in a shell of the test's whose agent is
// the doc's, its output compared with the doc's by shape.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/client"
	"github.com/lockagent/lockagent/internal/testkit"
)

// docScene is what a command of the docs needs besides a shell: the state
// the doc has the agent in, and what the command is when it is not run
// as it is.
type docScene struct {
	// before sets up what the doc says the command finds.
	before func(s *docShell)
	// run runs the command in the shell's stead, and returns what the
	// reader sees: for the agent itself, a benchmark.
	run func(s *docShell) string
	// code is the exit status the doc gives the command.
	code int
	// ready, for a command the doc runs in the background (`&`), waits
	// until it does what the doc's next commands rely on.
	ready func(s *docShell)
}

// docScenes are the commands of the docs that are shown with their
// output, as the doc writes them. Every such command has a scene, so that
// the test never runs a command nobody has looked at.
var docScenes = map[string]docScene{
	// README.md.
	"go run ./cmd/lockagent agent -socket /tmp/lockagent.sock": {
		run: func(s *docShell) string {
			s.startAgent()
			eventually(s.t, callTimeout, "the agent's first log line", func() bool {
				return strings.Contains(s.agent.stderr.String(), "\n")
			})
			return strings.SplitAfter(s.agent.stderr.String(), "\n")[0]
		},
	},
	// A session by hand (see docShell.socat).
	"socat - UNIX-CONNECT:/tmp/lockagent.sock": {},
	// The sessions of a session by hand, as they were before the release.
	"./lockagent ctl list": {
		before: func(s *docShell) { s.replaySessions(`"op":"release"`) },
	},
	"./lockagent ctl inspect orders/42": {},
	"./lockagent ctl break orders/42":   {},
	// With both sessions ended.
	`./lockagent run -wait 5s orders/42 -- sh -c 'echo "holding $LOCKAGENT_NAME with token $LOCKAGENT_TOKEN"'`: {
		before: func(s *docShell) {
			s.closeTerms()
			s.waitLock("orders/42", false)
		},
	},
	"./lockagent run orders/42 -- sleep 30 &": {
		ready: func(s *docShell) { s.waitLock("orders/42", true) },
	},
	`./lockagent run -wait 1s orders/42 -- true; echo "exit status $?"`: {},
	// A short run: the doc's count of iterations is for its figures, not
	// for the lines' shape.
	"go test ./socketapi -run '^$' -bench . -benchtime 50000x": {
		run: func(s *docShell) string {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "go", "test", "./socketapi", "-run", "^$", "-bench", ".", "-benchtime", "200x")
			cmd.Dir = repoRoot
			// The go command's own environment (its caches), without the
			// user's agent.
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "LOCKAGENT_") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			out, err := cmd.CombinedOutput()
			require.NoError(s.t, err, "%s", out)
			var bench []string
			for _, l := range strings.SplitAfter(string(out), "\n") {
				if strings.HasPrefix(l, "Benchmark") {
					bench = append(bench, l)
				}
			}
			return strings.Join(bench, "")
		},
	},

	// docs/config.md: a file with a value that is not a duration, and a
	// password written in it.
	"lockagent config check -config lockagent.hcl": {
		before: func(s *docShell) {
			s.writeFile("lockagent.hcl", "leases {\n  default_ttl = \"15x\"\n}\n\n"+
				"backend \"redis\" {\n  addresses = [\"127.0.0.1:6379\"]\n  password  = \"secret\"\n}\n")
		},
		code: 1,
	},

	// docs/upgrades.md, on a running agent.
	"sudo lockagent ctl upgrade -socket /run/lockagent/agent.sock": {
		before: func(s *docShell) { s.startAgent() },
	},
	"lockagent ctl status": {},
}

// docPaths are the socket paths of the docs, which stand for the test
// agent's.
var docPaths = []string{"/tmp/lockagent.sock", "/run/lockagent/agent.sock"}

// TestDocCommands: every command of the README and docs/*.md shown with
// its output (after `$ ` in a block, or a block of `sh` followed by the
// block of its output) runs in the doc's order, as a reader runs it: in a
// shell whose ./lockagent is the binary under test and whose
// LOCKAGENT_SOCKET is the doc's agent, started by the doc's command where
// it has one, `sudo` left out. Its output must have the doc's shape (the
// same lines and words; numbers, ids, durations, versions, hosts and
// timestamps of their kind; a table's rows of sessions in any order; `...`
// for the rest) and its exit status the one the doc gives. A `socat`
// session is replayed as docs/protocol.md's examples are (TestDocProtocol),
// through a real socat.
func TestDocCommands(t *testing.T) {
	t.Parallel()
	used := map[string]bool{}
	for _, f := range docFiles(t) {
		steps := docSteps(t, f)
		for _, st := range steps {
			used[st.cmd] = true
		}
		if len(steps) == 0 {
			continue
		}
		t.Run(f, func(t *testing.T) {
			t.Parallel()
			s := newDocShell(t)
			for _, st := range steps {
				s.runStep(st)
			}
		})
	}
	for cmd := range docScenes {
		require.True(t, used[cmd], "a scene for a command the docs no longer show: %s", cmd)
	}
}

// docStep is a command of a doc with the output the doc shows, or a block
// of lines that goes on a socat session (cmd "").
type docStep struct {
	where string
	// prose is the paragraph before the step's block: where it says
	// which terminal a session's lines go to.
	prose string
	cmd   string
	out   []string
}

var (
	jsonLine    = regexp.MustCompile(`^\{.*\}$`)
	shComment   = regexp.MustCompile(`\s+#.*$`)
	socatPrefix = "socat - UNIX-CONNECT:"
)

// docSteps returns the commands of the markdown file rel shown with their
// output, in order.
func docSteps(t *testing.T, rel string) []docStep {
	t.Helper()
	blocks := mdBlocks(t, rel)
	src := strings.Split(readDoc(t, rel), "\n")
	var steps []docStep
	sessions := false
	for i, b := range blocks {
		switch {
		case len(b.lines) > 0 && strings.HasPrefix(b.lines[0], "$ "):
			for _, l := range b.lines {
				if cmd, ok := strings.CutPrefix(l, "$ "); ok {
					steps = append(steps, docStep{where: b.where(), prose: b.before, cmd: cmd})
					sessions = sessions || strings.HasPrefix(cmd, socatPrefix)
					continue
				}
				steps[len(steps)-1].out = append(steps[len(steps)-1].out, l)
			}
		case sessions && b.lang == "" && allMatch(b.lines, jsonLine):
			steps = append(steps, docStep{where: b.where(), prose: b.before, out: b.lines})
		case b.lang == "sh" && len(b.lines) == 1 && i+1 < len(blocks) && blocks[i+1].lang == "" &&
			blank(src[b.end:blocks[i+1].line-1]):
			// A command, then the block of its output.
			cmd := shComment.ReplaceAllString(b.lines[0], "")
			steps = append(steps, docStep{where: b.where(), prose: b.before, cmd: cmd, out: blocks[i+1].lines})
		}
	}
	for _, st := range steps {
		if st.cmd != "" {
			_, ok := docScenes[st.cmd]
			require.True(t, ok, "%s: the command %q has no scene in docScenes", st.where, st.cmd)
		}
	}
	return steps
}

func allMatch(lines []string, re *regexp.Regexp) bool {
	for _, l := range lines {
		if !re.MatchString(l) {
			return false
		}
	}
	return len(lines) > 0
}

func blank(lines []string) bool {
	for _, l := range lines {
		if strings.TrimSpace(l) != "" {
			return false
		}
	}
	return true
}

// docShell is a reader's shell for one doc: a directory holding
// ./lockagent, also on PATH, with LOCKAGENT_SOCKET exported to the doc's
// agent (as the README has its reader do), and the socat sessions the
// reader has open.
type docShell struct {
	t      *testing.T
	dir    string
	socket string
	agent  *proc // the doc's agent, once started
	terms  []*docTerm
	// binds are the shortened ids of the sessions' lines bound to the
	// agent's; shared by every terminal.
	binds map[string]string
	// sessions are the session steps run so far, to open them again.
	sessions []docStep
}

func newDocShell(t *testing.T) *docShell {
	testkit.SkipShort(t, "the lockagent binary")
	dir, err := os.MkdirTemp("", "la")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Symlink(lockagentBin, filepath.Join(dir, "lockagent")))
	s := &docShell{t: t, dir: dir, socket: filepath.Join(dir, "s"), binds: map[string]string{}}
	t.Cleanup(s.closeTerms)
	return s
}

// env is the environment of the shell's commands.
func (s *docShell) env() []string {
	var env []string
	for _, kv := range baseEnv() {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	return append(env, "PATH="+s.dir+":"+os.Getenv("PATH"), "LOCKAGENT_SOCKET="+s.socket)
}

// writeFile writes a file in the shell's directory.
func (s *docShell) writeFile(name, content string) {
	require.NoError(s.t, os.WriteFile(filepath.Join(s.dir, name), []byte(content), 0o644))
}

// startAgent starts the doc's agent, on the shell's socket, with a state
// directory of the test's (run as root, its default would be
// /var/lib/lockagent, which the test must not touch). An agent that an
// upgrade handed over to a new process is stopped at the end of the test.
func (s *docShell) startAgent() {
	s.t.Helper()
	s.writeFile("agent.hcl", fmt.Sprintf("state_dir = %q\n", filepath.Join(s.dir, "state")))
	s.agent = startProc(s.t, "agent", nil, lockagentBin, "agent", "-socket", s.socket, "-config", filepath.Join(s.dir, "agent.hcl"))
	first := s.agent.cmd.Process.Pid
	stopUpgradedAtCleanup(s.t, s.socket, first)
	eventually(s.t, exitTimeout, "the agent listens", func() bool {
		if s.agent.exited() {
			return true
		}
		c, err := client.Dial(context.Background(), s.socket)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	require.False(s.t, s.agent.exited(), "the agent exited")
}

// runStep runs a step and compares what the reader sees with the doc.
func (s *docShell) runStep(st docStep) {
	s.t.Helper()
	if st.cmd == "" || strings.HasPrefix(st.cmd, socatPrefix) {
		s.socat(st)
		return
	}
	sc := docScenes[st.cmd]
	if sc.before != nil {
		sc.before(s)
	}
	var out string
	switch {
	case sc.run != nil:
		out = sc.run(s)
	case strings.HasSuffix(st.cmd, " &"):
		require.NotNil(s.t, sc.ready, "%s: a command in the background needs its scene's ready", st.where)
		s.background(strings.TrimSuffix(st.cmd, " &"))
		sc.ready(s)
	default:
		var code int
		out, code = s.sh(st.cmd)
		require.Equal(s.t, sc.code, code, "%s: the exit status of %s; it printed\n%s", st.where, st.cmd, out)
	}
	require.NoError(s.t, s.sameShape(st.out, out), "%s: %s printed\n%s", st.where, st.cmd, out)
}

// command is the doc's command as the shell runs it: the doc's paths are
// the test's, and `sudo` is left out (a test runs as the agent's user or
// root, either an admin).
func (s *docShell) command(cmd string) string {
	cmd = strings.TrimPrefix(cmd, "sudo ")
	for _, p := range docPaths {
		cmd = strings.ReplaceAll(cmd, p, s.socket)
	}
	return cmd
}

// sh runs a command to its end, and returns its output, stdout and
// stderr as a terminal shows them, and its exit status.
func (s *docShell) sh(cmd string) (string, int) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), exitTimeout)
	defer cancel()
	c := exec.CommandContext(ctx, "sh", "-c", s.command(cmd))
	c.Dir, c.Env = s.dir, s.env()
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	c.WaitDelay = 2 * time.Second
	err := c.Run()
	require.NoError(s.t, ctx.Err(), "%s did not finish in time; it printed\n%s", cmd, out.String())
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		require.NoError(s.t, err, cmd)
	}
	return out.String(), c.ProcessState.ExitCode()
}

// background starts a command as a shell's `&` does; it is stopped, with
// SIGTERM to its process group, at the end of the test.
func (s *docShell) background(cmd string) {
	s.t.Helper()
	c := exec.Command("sh", "-c", s.command(cmd))
	c.Dir, c.Env = s.dir, s.env()
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(s.t, c.Start())
	done := make(chan struct{})
	go func() {
		c.Wait()
		close(done)
	}()
	s.t.Cleanup(func() {
		syscall.Kill(-c.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(exitTimeout):
			syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			<-done
			s.t.Errorf("%s did not end on SIGTERM", cmd)
		}
	})
}

// waitLock waits until name is held, or free.
func (s *docShell) waitLock(name string, held bool) {
	s.t.Helper()
	w := dialWire(s.t, s.socket)
	defer w.close()
	eventually(s.t, callTimeout, fmt.Sprintf("%s held: %v", name, held), func() bool {
		return w.call(map[string]any{"id": 1, "op": "inspect", "name": name})["locked"] == held
	})
}

// docTerm is a terminal running socat on the agent's socket.
type docTerm struct {
	name string // "second", as the doc calls its terminal
	cmd  *exec.Cmd
	done chan struct{}
	r    *replay
	// pending are the ids of the requests typed in it that the doc has
	// not shown answered yet.
	pending map[string]bool
}

// terminalName finds the terminal that prose speaks of: "second" in "in a
// second terminal".
var terminalName = regexp.MustCompile(`(\w+) terminal\b`)

// socat runs a step of a session by hand: `socat` opens a terminal, then
// the lines typed in it are sent and the agent's answers compared, as
// TestDocProtocol does. A block without `socat` goes on in the terminal
// its prose names, else in the one that waits for its first answer.
func (s *docShell) socat(st docStep) {
	s.t.Helper()
	var lines []wireLine
	for _, l := range st.out {
		obj, ok := parseExpected(s.t, l).(map[string]any)
		require.True(s.t, ok, "%s: %s is not a JSON object", st.where, l)
		_, typed := obj["op"]
		lines = append(lines, wireLine{typed, l})
	}
	name := ""
	if m := terminalName.FindStringSubmatch(st.prose); m != nil {
		name = m[1]
	}
	var term *docTerm
	if st.cmd != "" {
		require.NotEmpty(s.t, name, "%s: the prose does not name the terminal of this socat", st.where)
		term = s.openTerm(name)
	} else {
		term = s.findTerm(st.where, name, lines)
	}
	s.sessions = append(s.sessions, st)
	term.r.run(lines)
	for _, l := range lines {
		if id := lineID(s.t, l.text); id != "" {
			term.pending[id] = l.sent
		}
	}
}

// findTerm is the open terminal named name, or with name "" the one
// terminal waiting for the answer that the first expected line is.
func (s *docShell) findTerm(where, name string, lines []wireLine) *docTerm {
	s.t.Helper()
	var found []*docTerm
	for _, term := range s.terms {
		if name != "" && term.name == name {
			return term
		}
		if name == "" && len(lines) > 0 && !lines[0].sent && term.pending[lineID(s.t, lines[0].text)] {
			found = append(found, term)
		}
	}
	require.Len(s.t, found, 1, "%s: which terminal these lines go to (the prose names %q)", where, name)
	return found[0]
}

// lineID is the id of a line of a session, as JSON; "" for an event.
func lineID(t *testing.T, line string) string {
	t.Helper()
	var msg struct{ ID json.RawMessage }
	require.NoError(t, json.Unmarshal([]byte(line), &msg), line)
	return string(msg.ID)
}

// openTerm starts socat on the agent's socket, in a new terminal.
func (s *docShell) openTerm(name string) *docTerm {
	s.t.Helper()
	inR, inW, err := os.Pipe()
	require.NoError(s.t, err)
	outR, outW, err := os.Pipe()
	require.NoError(s.t, err)
	cmd := exec.Command("socat", "-", "UNIX-CONNECT:"+s.socket)
	cmd.Env = s.env()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, outW
	require.NoError(s.t, cmd.Start(), "socat (apt-get install socat)")
	inR.Close()
	outW.Close()
	term := &docTerm{name: name, cmd: cmd, done: make(chan struct{}), pending: map[string]bool{}}
	go func() {
		cmd.Wait()
		outR.Close()
		close(term.done)
	}()
	term.r = newReplay(s.t, &wireConn{t: s.t, w: inW, rd: outR, r: bufio.NewReader(outR)}, map[string]map[string]bool{})
	term.r.binds = s.binds
	s.terms = append(s.terms, term)
	return term
}

// closeTerms ends every session by hand, with Ctrl-D: socat exits once
// the agent has closed the connection.
func (s *docShell) closeTerms() {
	for _, term := range s.terms {
		term.r.w.close()
	}
	for _, term := range s.terms {
		select {
		case <-term.done:
		case <-time.After(exitTimeout):
			term.cmd.Process.Kill()
			<-term.done
			s.t.Errorf("socat of the %s terminal did not exit after Ctrl-D", term.name)
		}
	}
	s.terms = nil
}

// replaySessions ends the sessions by hand and runs them again, from the
// start up to the first step with a line that contains stop, with ids of
// their own. It returns once the agent has them all, and their waiting
// requests, and no other session.
func (s *docShell) replaySessions(stop string) {
	s.t.Helper()
	s.closeTerms()
	steps := s.sessions
	s.sessions, s.binds = nil, map[string]string{}
	for _, st := range steps {
		if strings.Contains(strings.Join(st.out, "\n"), stop) {
			break
		}
		s.socat(st)
	}
	require.NotEmpty(s.t, s.terms, "the sessions to replay")
	waiting := 0
	for _, term := range s.terms {
		for _, p := range term.pending {
			if p {
				waiting++
			}
		}
	}
	// Asked in the first session, which the agent has anyway.
	probe := s.terms[0].r.w
	eventually(s.t, callTimeout, "the agent has the sessions replayed, and only them", func() bool {
		sessions := probe.call(map[string]any{"id": "probe", "op": "list"})["sessions"].([]any)
		n := 0
		for _, ss := range sessions {
			n += len(ss.(map[string]any)["waiting"].([]any))
		}
		return len(sessions) == len(s.terms) && n == waiting
	})
}

// Output shapes. A doc's line matches a line of the same words, in which
// numbers, ids, durations, versions, timestamps and hosts may be others of
// their kind; the test's paths stand for the doc's.

var shapeTokens = []struct {
	re      *regexp.Regexp
	pattern string
}{
	{regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`), `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`},
	{regexp.MustCompile(`^\d+\.\d+\.\d+(-[\w.]+)?`), `\S+`}, // a version
	{regexp.MustCompile(`^[slc]_[a-z0-9]{26}`), `[slc]_[a-z0-9]{26}`},
	{regexp.MustCompile(`^(\d+(\.\d+)?(ns|µs|ms|s|m|h))+\b`), `(\d+(\.\d+)?(ns|µs|ms|s|m|h))+`},
	{regexp.MustCompile(`^\d+(\.\d+)?`), `\d+(\.\d+)?`},
	{regexp.MustCompile(`^vm\b`), `\S+`}, // the host
}

// padding is the space between a table's columns, or a benchmark's.
var padding = regexp.MustCompile(`^ {2,}`)

// exitStatusLine is a line that shows an exit status: it is compared as it is.
var exitStatusLine = regexp.MustCompile(`^exit status \d+$`)

// shape is the pattern of the lines like the doc's line.
func (s *docShell) shape(line string) *regexp.Regexp {
	if exitStatusLine.MatchString(line) {
		return regexp.MustCompile("^" + regexp.QuoteMeta(line) + "$")
	}
	var b strings.Builder
	b.WriteString("^")
next:
	for i := 0; i < len(line); {
		for _, p := range docPaths {
			if strings.HasPrefix(line[i:], p) {
				b.WriteString(regexp.QuoteMeta(s.socket))
				i += len(p)
				continue next
			}
		}
		if m := padding.FindString(line[i:]); m != "" {
			b.WriteString(`[ \t]+`)
			i += len(m)
			continue
		}
		// A token starts a word: not after a letter, a digit, `_` or `/`
		// (orders/42 and p50 are words as they are).
		if i == 0 || !strings.ContainsAny(line[i-1:i], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_/") {
			for _, tok := range shapeTokens {
				if m := tok.re.FindString(line[i:]); m != "" {
					b.WriteString(tok.pattern)
					i += len(m)
					continue next
				}
			}
		}
		_, size := utf8.DecodeRuneInString(line[i:])
		b.WriteString(regexp.QuoteMeta(line[i : i+size]))
		i += size
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

// sessionRow is a row of a table of sessions, which are sorted by their
// random ids.
var sessionRow = regexp.MustCompile(`^s_[a-z0-9]{26}\s`)

// sameShape compares output with the doc's lines: line by line, a run of
// rows of sessions in any order, and `...` standing for any lines left.
func (s *docShell) sameShape(doc []string, output string) error {
	got := strings.Split(strings.TrimSuffix(output, "\n"), "\n")
	if output == "" {
		got = nil
	}
	for i := 0; i < len(doc); i++ {
		if doc[i] == "..." {
			return nil
		}
		if sessionRow.MatchString(doc[i]) {
			// The run of rows, matched in any order.
			j := i
			for j < len(doc) && sessionRow.MatchString(doc[j]) {
				j++
			}
			if len(got) < j {
				return fmt.Errorf("%d lines, not %d or more", len(got), j)
			}
			used := make([]bool, j)
		row:
			for _, d := range doc[i:j] {
				re := s.shape(d)
				for k := i; k < j; k++ {
					if !used[k] && re.MatchString(got[k]) {
						used[k] = true
						continue row
					}
				}
				return fmt.Errorf("no row is like\n%s", d)
			}
			i = j - 1
			continue
		}
		if i >= len(got) {
			return fmt.Errorf("no line like line %d of the doc's:\n%s", i+1, doc[i])
		}
		if !s.shape(doc[i]).MatchString(got[i]) {
			return fmt.Errorf("line %d is not like the doc's\n%s", i+1, doc[i])
		}
	}
	if len(got) > len(doc) {
		return fmt.Errorf("%d lines, the doc's %d", len(got), len(doc))
	}
	return nil
}
