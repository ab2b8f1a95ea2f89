package main

import (
	"bytes"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"
)

// onJournal tells whether f is connected to the journal: systemd sets
// JOURNAL_STREAM to the device and inode of the stream it gives a service
// (see systemd.exec(5)), and the check keeps a redirected stderr, or one
// inherited by a child, from being taken for it.
func onJournal(f *os.File, journalStream string) bool {
	devStr, inoStr, ok := strings.Cut(journalStream, ":")
	if !ok {
		return false
	}
	dev, err1 := strconv.ParseUint(devStr, 10, 64)
	ino, err2 := strconv.ParseUint(inoStr, 10, 64)
	if err1 != nil || err2 != nil {
		return false
	}
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && uint64(st.Dev) == dev && st.Ino == ino
}

// journalWriter gives every line of a log entry its syslog priority as a
// "<N>" prefix, which the journal reads and strips (SyslogLevelPrefix=, on
// by default), so that `journalctl -p warning` finds the agent's warnings.
type journalWriter struct{ w io.Writer }

// priorities maps hclog's levels to syslog's.
var priorities = map[hclog.Level][]byte{
	hclog.Trace: []byte("<7>"), // debug
	hclog.Debug: []byte("<7>"), // debug
	hclog.Info:  []byte("<6>"), // info
	hclog.Warn:  []byte("<4>"), // warning
	hclog.Error: []byte("<3>"), // err
}

// Write writes output that carries no level, as info.
func (j journalWriter) Write(p []byte) (int, error) { return j.LevelWrite(hclog.Info, p) }

// LevelWrite writes one log entry of the level; hclog calls it.
func (j journalWriter) LevelWrite(level hclog.Level, p []byte) (int, error) {
	prefix, ok := priorities[level]
	if !ok {
		prefix = priorities[hclog.Info]
	}
	var buf bytes.Buffer
	for line := range bytes.Lines(p) {
		buf.Write(prefix)
		buf.Write(line)
	}
	if _, err := j.w.Write(buf.Bytes()); err != nil {
		return 0, err
	}
	return len(p), nil
}

// logOutput is where the agent's logs go: stderr, with priorities when it
// is the journal's stream. journal says which, so that the journal's own
// timestamps stand in for hclog's.
func logOutput(stderr io.Writer) (out io.Writer, journal bool) {
	if f, ok := stderr.(*os.File); ok && onJournal(f, os.Getenv("JOURNAL_STREAM")) {
		return journalWriter{stderr}, true
	}
	return stderr, false
}
