package lockfile

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAcquireIsExclusive: a held lock file is refused to the next taker,
// which learns the holder's pid; released, it can be taken again, and the
// file stays, private to its owner.
func TestAcquireIsExclusive(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "x.lock")

	l, err := Acquire(path)
	require.NoError(t, err)
	fi, err := os.Lstat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode(), "a regular file, whatever the umask")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(os.Getpid())+"\n", string(data))

	// flock conflicts between two opens of one process as between two
	// processes.
	_, err = Acquire(path)
	var held *HeldError
	require.ErrorAs(t, err, &held)
	require.Equal(t, path, held.Path)
	require.Equal(t, os.Getpid(), held.PID)
	require.EqualError(t, err, path+" is held by pid "+strconv.Itoa(os.Getpid()))

	require.NoError(t, l.Release())
	_, err = os.Lstat(path)
	require.NoError(t, err, "the lock file stays")
	l, err = Acquire(path)
	require.NoError(t, err, "a released lock can be taken again")
	require.NoError(t, l.Release())
}

// TestAcquireSaysNoPIDItCannotRead: a lock file that says no pid still
// tells that another process holds it.
func TestAcquireSaysNoPIDItCannotRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	l, err := Acquire(path)
	require.NoError(t, err)
	defer l.Release()
	require.NoError(t, os.WriteFile(path, []byte("garbage"), 0o600))
	_, err = Acquire(path)
	var held *HeldError
	require.ErrorAs(t, err, &held)
	require.Zero(t, held.PID)
	require.EqualError(t, err, path+" is held by another process")
}

// TestAcquireRefusesWhatIsNotItsOwn: a link is never followed, and what is
// not a regular file of the user's is refused, untouched, without
// hanging.
func TestAcquireRefusesWhatIsNotItsOwn(t *testing.T) {
	dir := t.TempDir()
	precious := filepath.Join(dir, "precious")
	require.NoError(t, os.WriteFile(precious, []byte("keep"), 0o600))
	missing := filepath.Join(dir, "missing")

	for _, tc := range []struct {
		name string
		make func(path string) error
		want string
	}{
		{"link to a file", func(p string) error { return os.Symlink(precious, p) }, "is a symbolic link; not following it"},
		{"link to nothing", func(p string) error { return os.Symlink(missing, p) }, "is a symbolic link; not following it"},
		{"directory", func(p string) error { return os.Mkdir(p, 0o700) }, "is a directory"},
		{"fifo", func(p string) error { return syscall.Mkfifo(p, 0o600) }, "is not a regular file of uid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			require.NoError(t, tc.make(path))
			l, err := Acquire(path)
			require.Nil(t, l)
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, path)
			var held *HeldError
			require.False(t, errors.As(err, &held))
		})
	}
	data, err := os.ReadFile(precious)
	require.NoError(t, err)
	require.Equal(t, "keep", string(data), "the link's target was written")
	_, err = os.Lstat(missing)
	require.ErrorIs(t, err, os.ErrNotExist, "the link's target was created")

	if os.Geteuid() == 0 { // only root gives a file away
		path := filepath.Join(dir, "theirs")
		require.NoError(t, os.WriteFile(path, nil, 0o666))
		require.NoError(t, os.Chown(path, 4242, -1))
		_, err := Acquire(path)
		require.ErrorContains(t, err, "is not a regular file of uid 0's")
		require.ErrorContains(t, err, "owner 4242")
	}
}
