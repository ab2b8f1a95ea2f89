package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// fieldError is a problem with one field, named by its path in the file:
// "leases.default_ttl", `acl.rule "orders/*".groups[1]`.
type fieldError struct {
	field string
	err   error
}

func (e *fieldError) Error() string { return e.field + ": " + e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

func newFieldError(field, format string, args ...any) *fieldError {
	return &fieldError{field, fmt.Errorf(format, args...)}
}

// problems checks c field by field; it is Validate's body, kept apart so
// that Load can place each problem in the file.
func (c *Config) problems() []*fieldError {
	var ps []*fieldError
	bad := func(field, format string, args ...any) {
		ps = append(ps, newFieldError(field, format, args...))
	}
	group := func(field, g string) {
		if err := checkGroup(g); err != nil {
			ps = append(ps, &fieldError{field, err})
		}
	}

	switch s := c.Socket; {
	case s.Path == "":
		bad("socket.path", "must not be empty")
	case !filepath.IsAbs(s.Path):
		bad("socket.path", "%q is not an absolute path", s.Path)
	case strings.HasSuffix(s.Path, "/") || filepath.Base(s.Path) == "." || filepath.Base(s.Path) == "..":
		bad("socket.path", "%q names a directory, not a socket file", s.Path)
	case len(s.Path) > socketPathBytes:
		bad("socket.path", "is %d bytes long; a socket path has at most %d", len(s.Path), socketPathBytes)
	}
	if c.Socket.Mode&^os.ModePerm != 0 {
		bad("socket.mode", "%04o has bits beyond 0777", uint32(c.Socket.Mode))
	}
	if c.Socket.Group != "" {
		group("socket.group", c.Socket.Group)
	}

	switch {
	case c.StateDir == "":
		bad("state_dir", "must be set; the default needs $XDG_STATE_HOME or $HOME")
	case !filepath.IsAbs(c.StateDir):
		bad("state_dir", "%q is not an absolute path", c.StateDir)
	}
	if !slices.Contains([]string{"trace", "debug", "info", "warn", "error"}, c.LogLevel) {
		bad("log_level", "%q is not one of trace, debug, info, warn, error", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("log_format", "%q is not text or json", c.LogFormat)
	}

	switch be := c.Backend; be.Kind {
	case "memory":
		if be.Redis != nil {
			bad("backend", "redis settings given for the memory backend")
		}
		if be.Etcd != nil {
			bad("backend", "etcd settings given for the memory backend")
		}
	case "redis":
		if be.Etcd != nil {
			bad("backend", "etcd settings given for the redis backend")
		}
		ps = append(ps, be.Redis.problems()...)
	case "etcd":
		if be.Redis != nil {
			bad("backend", "redis settings given for the etcd backend")
		}
		ps = append(ps, be.Etcd.problems()...)
	default:
		bad("backend", "unknown kind %q; want memory, redis or etcd", be.Kind)
	}

	l := c.Leases
	for _, f := range []struct {
		field string
		d     time.Duration
	}{{"leases.default_ttl", l.DefaultTTL}, {"leases.min_ttl", l.MinTTL}, {"leases.max_ttl", l.MaxTTL}} {
		if f.d%time.Millisecond != 0 {
			bad(f.field, "%s is not a whole number of milliseconds", f.d)
		}
	}
	switch {
	case l.MinTTL < ttlFloor:
		bad("leases.min_ttl", "%s is below %s", formatDuration(l.MinTTL), formatDuration(ttlFloor))
	case l.MaxTTL > ttlCeiling:
		bad("leases.max_ttl", "%s is above %s", formatDuration(l.MaxTTL), formatDuration(ttlCeiling))
	case l.MinTTL > l.MaxTTL:
		bad("leases.max_ttl", "%s is below min_ttl %s", formatDuration(l.MaxTTL), formatDuration(l.MinTTL))
	case l.DefaultTTL < l.MinTTL:
		bad("leases.default_ttl", "%s is below min_ttl %s", formatDuration(l.DefaultTTL), formatDuration(l.MinTTL))
	case l.DefaultTTL > l.MaxTTL:
		bad("leases.default_ttl", "%s is above max_ttl %s", formatDuration(l.DefaultTTL), formatDuration(l.MaxTTL))
	}

	for _, f := range []struct {
		field string
		n     int
	}{{"limits.max_sessions", c.Limits.MaxSessions}, {"limits.max_leases_per_session", c.Limits.MaxLeasesPerSession}, {"limits.max_waiters", c.Limits.MaxWaiters}} {
		if f.n < 1 {
			bad(f.field, "%d is below 1", f.n)
		}
	}
	for _, f := range []struct {
		field string
		n     int
	}{
		{"limits.max_connections_per_uid", c.Limits.MaxConnectionsPerUID},
		{"limits.max_sessions_per_uid", c.Limits.MaxSessionsPerUID},
		{"limits.max_leases_per_uid", c.Limits.MaxLeasesPerUID},
	} {
		if f.n < 0 {
			bad(f.field, "%d is below 0 (0: no cap per uid)", f.n)
		}
	}
	if n := c.Limits.MaxLineBytes; n < lineBytesFloor || n > lineBytesCeiling {
		bad("limits.max_line_bytes", "%d is not between %d and %d", n, lineBytesFloor, lineBytesCeiling)
	}
	switch l := c.Limits; {
	case l.MaxOutputBytes < outputBytesFloor:
		bad("limits.max_output_bytes", "%d is below %d", l.MaxOutputBytes, outputBytesFloor)
	case l.MaxOutputBytesPerUID < outputBytesFloor:
		bad("limits.max_output_bytes_per_uid", "%d is below %d", l.MaxOutputBytesPerUID, outputBytesFloor)
	case l.MaxOutputBytesPerUID > l.MaxOutputBytes:
		bad("limits.max_output_bytes_per_uid", "%d is above max_output_bytes %d", l.MaxOutputBytesPerUID, l.MaxOutputBytes)
	}

	if a := c.ACL; a != nil {
		for i, g := range a.AdminGroups {
			group(fmt.Sprintf("acl.admin_groups[%d]", i), g)
		}
		seen := map[string]bool{}
		for _, r := range a.Rules {
			field := rulePath(r.Pattern)
			if r.Pattern == "" {
				bad(field, "the pattern must not be empty")
			}
			if seen[r.Pattern] {
				bad(field, "duplicate rule")
			}
			seen[r.Pattern] = true
			// An empty list would read as "nobody" but match like a
			// missing one, "everybody": refuse it.
			if r.UIDs != nil && len(r.UIDs) == 0 {
				bad(field+".uids", "must not be empty; leave it out to match every uid")
			}
			if r.Groups != nil && len(r.Groups) == 0 {
				bad(field+".groups", "must not be empty; leave it out to match every group")
			}
			if r.Modes != nil && len(r.Modes) == 0 {
				bad(field+".modes", "must not be empty; leave it out to allow every mode")
			}
			for i, g := range r.Groups {
				group(fmt.Sprintf("%s.groups[%d]", field, i), g)
			}
			for i, m := range r.Modes {
				if m != "exclusive" && m != "shared" {
					bad(fmt.Sprintf("%s.modes[%d]", field, i), "%q is not exclusive or shared", m)
				}
			}
		}
	}

	if addr := c.Metrics.Address; addr != "" {
		if err := checkHostPort(addr); err != nil {
			ps = append(ps, &fieldError{"metrics.address", err})
		}
	}
	return ps
}

// problems checks the redis backend's settings; r may be nil.
func (r *Redis) problems() []*fieldError {
	const path = `backend "redis"`
	if r == nil {
		return []*fieldError{newFieldError("backend", "the redis backend has no settings")}
	}
	var ps []*fieldError
	bad := func(field, format string, args ...any) {
		ps = append(ps, newFieldError(path+"."+field, format, args...))
	}
	switch {
	case len(r.Addresses) == 0:
		bad("addresses", "must list at least one host:port")
	case len(r.Addresses) > 1 && r.MasterName == "" && !r.Cluster:
		bad("addresses", "several addresses need master_name (Sentinel) or cluster = true")
	}
	for i, addr := range r.Addresses {
		if err := checkHostPort(addr); err != nil {
			ps = append(ps, &fieldError{fmt.Sprintf("%s.addresses[%d]", path, i), err})
		}
	}
	if r.Cluster && r.MasterName != "" {
		bad("cluster", "Redis Cluster and Sentinel (master_name) exclude each other")
	}
	switch {
	case r.DB < 0:
		bad("db", "%d is below 0", r.DB)
	case r.Cluster && r.DB != 0:
		bad("db", "must be 0 with Redis Cluster")
	}
	for _, pw := range []struct{ prefix, file, credential string }{
		{"", r.PasswordFile, r.PasswordCredential},
		{"sentinel_", r.SentinelPasswordFile, r.SentinelPasswordCredential},
	} {
		if pw.file != "" && pw.credential != "" {
			bad(pw.prefix+"password_credential", "%[1]spassword_file and %[1]spassword_credential exclude each other", pw.prefix)
		}
		if c := pw.credential; c != "" && (strings.ContainsRune(c, '/') || c == "." || c == "..") {
			bad(pw.prefix+"password_credential", "%q is not a credential name", c)
		}
	}
	if r.MasterName == "" {
		for _, f := range []struct{ field, value string }{
			{"sentinel_username", r.SentinelUsername},
			{"sentinel_password_file", r.SentinelPasswordFile},
			{"sentinel_password_credential", r.SentinelPasswordCredential},
		} {
			if f.value != "" {
				bad(f.field, "only with Sentinel (master_name)")
			}
		}
	}
	if r.KeyPrefix == "" {
		bad("key_prefix", "must not be empty")
	}
	if strings.ContainsAny(r.KeyPrefix, "{}") {
		// A brace would move the hash tag Redis Cluster reads, and a
		// name's keys could fall in different slots.
		bad("key_prefix", "must not hold { or }")
	}
	if t := r.TLS; t != nil && (t.CertFile == "") != (t.KeyFile == "") {
		bad("tls", "cert_file and key_file go together")
	}
	switch {
	case r.WaitReplicas < 0:
		bad("wait_replicas", "%d is below 0", r.WaitReplicas)
	case r.WaitReplicas > 0 && r.Cluster:
		// WAIT names no key: a Cluster pipeline would not send it to the
		// primary that made the grant.
		bad("wait_replicas", "is not supported with Redis Cluster")
	}
	if r.WaitTimeout < time.Millisecond || r.WaitTimeout > maxWaitTimeout {
		bad("wait_timeout", "%s is not between 1ms and %s", r.WaitTimeout, maxWaitTimeout)
	}
	return ps
}

// problems checks the etcd backend's settings; e may be nil.
func (e *Etcd) problems() []*fieldError {
	const path = `backend "etcd"`
	if e == nil {
		return []*fieldError{newFieldError("backend", "the etcd backend has no settings")}
	}
	var ps []*fieldError
	bad := func(field, format string, args ...any) {
		ps = append(ps, newFieldError(path+"."+field, format, args...))
	}
	if len(e.Endpoints) == 0 {
		bad("endpoints", "must list at least one host:port")
	}
	for i, addr := range e.Endpoints {
		if err := checkHostPort(addr); err != nil {
			ps = append(ps, &fieldError{fmt.Sprintf("%s.endpoints[%d]", path, i), err})
		}
	}
	if e.KeyPrefix == "" {
		bad("key_prefix", "must not be empty")
	}
	switch c := e.PasswordCredential; {
	case e.PasswordFile != "" && c != "":
		bad("password_credential", "password_file and password_credential exclude each other")
	case c != "" && (strings.ContainsRune(c, '/') || c == "." || c == ".."):
		bad("password_credential", "%q is not a credential name", c)
	}
	// Etcd's authentication takes a user and a password together.
	hasPassword := e.PasswordFile != "" || e.PasswordCredential != ""
	switch {
	case e.Username == "" && hasPassword:
		bad("username", "must be set with a password")
	case e.Username != "" && !hasPassword:
		bad("username", "needs password_file or password_credential")
	}
	if t := e.TLS; t != nil && (t.CertFile == "") != (t.KeyFile == "") {
		bad("tls", "cert_file and key_file go together")
	}
	for _, f := range []struct {
		field string
		d     time.Duration
	}{{"dial_timeout", e.DialTimeout}, {"request_timeout", e.RequestTimeout}} {
		if f.d < minEtcdTimeout || f.d > maxEtcdTimeout {
			bad(f.field, "%s is not between %s and %s", formatDuration(f.d), formatDuration(minEtcdTimeout), formatDuration(maxEtcdTimeout))
		}
	}
	return ps
}

// checkGroup accepts a gid or the name of a group that exists.
func checkGroup(g string) error {
	if g == "" {
		return errors.New("a group must not be empty")
	}
	if _, err := strconv.ParseUint(g, 10, 32); err == nil {
		return nil
	}
	if _, err := user.LookupGroup(g); err != nil {
		if errors.As(err, new(user.UnknownGroupError)) {
			return fmt.Errorf("unknown group %q", g)
		}
		return fmt.Errorf("looking up group %q: %w", g, err)
	}
	return nil
}

func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return fmt.Errorf("%q is not host:port", addr)
	}
	// A number up to 65535, or a service name known to the host.
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("%q: port %q is not a port number or a known service", addr, port)
	}
	return nil
}

func rulePath(pattern string) string { return fmt.Sprintf("acl.rule %q", pattern) }

// GroupID returns the gid of a group given by number or by name.
func GroupID(g string) (uint32, error) {
	if n, err := strconv.ParseUint(g, 10, 32); err == nil {
		return uint32(n), nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("group %q: %w", g, err)
	}
	n, err := strconv.ParseUint(grp.Gid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("group %q has gid %q: %w", g, grp.Gid, err)
	}
	return uint32(n), nil
}
