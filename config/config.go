// Package config owns lockagent's configuration: the HCL schema of the
// config file, the built-in defaults, validation, and the environment
// overrides. It turns a file into a plain, validated Config value and renders
// one back as HCL.
//
// It must not know sockets or backend internals: it checks that values are
// well formed and within bounds, and leaves binding the socket, dialling Redis
// and enforcing the ACL to the packages that do those things.
package config

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// Config is the agent's configuration. Load and Default return one;
// Validate checks one built in code.
type Config struct {
	Socket    Socket
	StateDir  string
	LogLevel  string // trace, debug, info, warn, error
	LogFormat string // text or json
	Backend   Backend
	Leases    Leases
	Limits    Limits
	ACL       *ACL // nil: no acl block
	Metrics   Metrics
}

// Socket is where the agent listens. Mode and Group apply only to a socket
// the agent binds itself, not to one handed over by systemd.
type Socket struct {
	Path  string
	Mode  os.FileMode // permission bits only
	Group string      // name or gid; empty: the agent's own group
}

// Backend selects the store that holds the locks.
type Backend struct {
	Kind  string // "memory" or "redis"
	Redis *Redis // set exactly when Kind is "redis"
}

// Redis configures the Redis backend. One address is a standalone server;
// several with MasterName are Sentinels; Cluster uses Redis Cluster.
type Redis struct {
	Addresses    []string // host:port
	MasterName   string
	Cluster      bool
	Username     string
	PasswordFile string // the password is never written in the config itself
	DB           int
	KeyPrefix    string
	TLS          *TLS // nil: plain TCP
}

// TLS configures TLS to Redis. Empty CAFile means the system roots;
// CertFile and KeyFile (a client certificate) go together.
type TLS struct {
	CAFile, CertFile, KeyFile string
}

// Leases bounds the lease TTLs that clients may ask for.
type Leases struct {
	DefaultTTL, MinTTL, MaxTTL time.Duration
}

// Limits caps the resources that clients can hold in the agent.
type Limits struct {
	MaxSessions, MaxLeasesPerSession, MaxWaiters, MaxLineBytes int
}

// ACL restricts which peers may lock which names, and who is an admin.
// Nil slices mean the attribute was not set; for AdminUIDs and AdminGroups
// that keeps the built-in admins, while an empty, non-nil slice replaces them
// with nobody.
type ACL struct {
	AdminUIDs   []uint32
	AdminGroups []string // names or gids
	Rules       []Rule
}

// Rule allows the listed peers to lock names matching Pattern in the listed
// modes. Nil UIDs and Groups together mean every peer; nil Modes, every mode.
type Rule struct {
	Pattern string // glob: * matches any run of characters, / included; ? one character
	UIDs    []uint32
	Groups  []string // names or gids
	Modes   []string // "exclusive", "shared"
}

// Metrics configures the Prometheus endpoint.
type Metrics struct {
	Address string // host:port serving /metrics; empty: off
}

// Bounds enforced by Validate.
const (
	ttlFloor         = 100 * time.Millisecond // shorter leases would be spent renewing
	ttlCeiling       = 24 * time.Hour         // a dead host's locks come free within a day
	lineBytesFloor   = 1 << 10                // room for any valid request
	lineBytesCeiling = 16 << 20               // a bound on per-connection memory
	socketPathBytes  = 107                    // sun_path on Linux, less its NUL
)

// Default returns the built-in configuration: what the agent runs with when
// there is no config file, and what a file is decoded on top of.
func Default() Config {
	return Config{
		Socket: Socket{
			// System agents share /run/lockagent; a user's agent lives in
			// that user's runtime directory.
			Path: DefaultSocketPath(),
			// The owner and the socket's group may connect; nobody else.
			Mode: 0o660,
			// The group the agent runs as.
			Group: "",
		},
		// Where the memory backend keeps its fencing epoch across restarts.
		StateDir: defaultStateDir(os.Geteuid(), os.Getenv),
		// What an operator needs day to day; debug and trace add detail.
		LogLevel: "info",
		// For people and journald; "json" suits log collectors.
		LogFormat: "text",
		// In-process, one host, nothing else to run.
		Backend: Backend{Kind: "memory"},
		Leases: Leases{
			// Used when a request gives no ttl_ms: how long a lock outlives
			// a host or agent that dies.
			DefaultTTL: 15 * time.Second,
			// Shorter leases would spend much of their life renewing.
			MinTTL: time.Second,
			// The longest a dead host can keep a lock.
			MaxTTL: 24 * time.Hour,
		},
		Limits: Limits{
			// Sessions open at once, attached or waiting to be resumed.
			MaxSessions: 10000,
			// Leases one session may hold at once.
			MaxLeasesPerSession: 1000,
			// Requests waiting for a lock at once, across all sessions.
			MaxWaiters: 10000,
			// The longest request line, as the protocol's default.
			MaxLineBytes: 64 << 10,
		},
		// No acl block: whoever can open the socket may lock any name.
		ACL: nil,
		// No metrics endpoint.
		Metrics: Metrics{Address: ""},
	}
}

// DefaultSocketPath returns the socket path used when neither a flag, the
// LOCKAGENT_SOCKET variable nor the config names one. Clients and the agent
// compute it the same way.
func DefaultSocketPath() string {
	return defaultSocketPath(os.Geteuid(), os.Getenv)
}

// defaultSocketPath is /run/lockagent/agent.sock for root and systemd
// services, else the user's runtime directory, else a per-uid file in the
// temporary directory.
func defaultSocketPath(euid int, getenv func(string) string) string {
	if euid == 0 || getenv("INVOCATION_ID") != "" || getenv("NOTIFY_SOCKET") != "" {
		return "/run/lockagent/agent.sock"
	}
	// The XDG spec says to ignore relative paths in its variables.
	if dir := getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(dir) {
		return filepath.Join(dir, "lockagent.sock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("lockagent-%d.sock", euid))
}

// defaultStateDir is /var/lib/lockagent for root, else the user's XDG state
// directory; empty when there is no home directory to put it in, which
// Validate reports.
func defaultStateDir(euid int, getenv func(string) string) string {
	if euid == 0 {
		return "/var/lib/lockagent"
	}
	if dir := getenv("XDG_STATE_HOME"); filepath.IsAbs(dir) {
		return filepath.Join(dir, "lockagent")
	}
	if home := getenv("HOME"); filepath.IsAbs(home) {
		return filepath.Join(home, ".local", "state", "lockagent")
	}
	return ""
}

// ApplyEnv applies the environment's overrides: LOCKAGENT_SOCKET, when set
// and not empty, replaces Socket.Path. Call Validate after every override.
func (c *Config) ApplyEnv(getenv func(string) string) {
	if path := getenv("LOCKAGENT_SOCKET"); path != "" {
		c.Socket.Path = path
	}
}

// Load reads the HCL file at path, decodes it on top of Default() and
// validates the result. Every error starts with the file, line and column
// and names the field, as in
//
//	lockagent.hcl:12,17: leases.default_ttl: "15x" is not a duration
//
// When there are several, they are joined one per line, in file order.
func Load(path string) (Config, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	return parse(src, path)
}

// parse is Load of the text src, read from the file named filename.
func parse(src []byte, filename string) (Config, error) {
	cfg := Default()
	d := decoder{file: filename, ranges: map[string]hcl.Range{}}
	file, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
	if !d.diags("", diags) {
		d.root(file.Body, &cfg)
	}
	if len(d.errs) == 0 {
		for _, p := range cfg.problems() {
			d.errs = append(d.errs, posError{d.rangeOf(p.field), p})
		}
	}
	if len(d.errs) > 0 {
		return Config{}, d.err()
	}
	return cfg, nil
}

// Validate reports every field of c that is malformed or out of bounds, one
// per line, each naming the field.
func (c *Config) Validate() error {
	var errs []error
	for _, p := range c.problems() {
		errs = append(errs, p)
	}
	return errors.Join(errs...)
}

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

	switch c.Backend.Kind {
	case "memory":
		if c.Backend.Redis != nil {
			bad("backend", "redis settings given for the memory backend")
		}
	case "redis":
		ps = append(ps, c.Backend.Redis.problems()...)
	default:
		bad("backend", "unknown kind %q; want memory or redis", c.Backend.Kind)
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
	if n := c.Limits.MaxLineBytes; n < lineBytesFloor || n > lineBytesCeiling {
		bad("limits.max_line_bytes", "%d is not between %d and %d", n, lineBytesFloor, lineBytesCeiling)
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
	if r.KeyPrefix == "" {
		bad("key_prefix", "must not be empty")
	}
	if t := r.TLS; t != nil && (t.CertFile == "") != (t.KeyFile == "") {
		bad("tls", "cert_file and key_file go together")
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
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return fmt.Errorf("%q is not host:port", addr)
	}
	return nil
}

func rulePath(pattern string) string { return fmt.Sprintf("acl.rule %q", pattern) }

// decoder walks the HCL body, decoding each attribute into the Config and
// recording where each field was written so that problems found later point
// into the file.
type decoder struct {
	file   string
	errs   []posError
	ranges map[string]hcl.Range // field path -> its value, or its block's header
}

type posError struct {
	rng hcl.Range
	err error
}

// err joins the errors in file order, each prefixed with its position.
func (d *decoder) err() error {
	slices.SortStableFunc(d.errs, func(a, b posError) int {
		return cmpPos(a.rng.Start, b.rng.Start)
	})
	errs := make([]error, len(d.errs))
	for i, e := range d.errs {
		if e.rng.Start.Line == 0 {
			errs[i] = fmt.Errorf("%s: %w", d.file, e.err)
		} else {
			errs[i] = fmt.Errorf("%s:%d,%d: %w", e.rng.Filename, e.rng.Start.Line, e.rng.Start.Column, e.err)
		}
	}
	return errors.Join(errs...)
}

func cmpPos(a, b hcl.Pos) int {
	if a.Line != b.Line {
		return a.Line - b.Line
	}
	return a.Column - b.Column
}

func (d *decoder) failf(field string, rng hcl.Range, format string, args ...any) {
	d.errs = append(d.errs, posError{rng, newFieldError(field, format, args...)})
}

// diags records HCL's error diagnostics under field and reports whether
// there were any.
func (d *decoder) diags(field string, diags hcl.Diagnostics) bool {
	for _, diag := range diags {
		if diag.Severity != hcl.DiagError {
			continue
		}
		msg := lowerFirst(diag.Summary)
		if diag.Detail != "" {
			msg += ": " + lowerFirst(strings.TrimSuffix(diag.Detail, "."))
		}
		rng := hcl.Range{Filename: d.file}
		if diag.Subject != nil {
			rng = *diag.Subject
		}
		var err error = errors.New(msg)
		if field != "" {
			err = &fieldError{field, err}
		}
		d.errs = append(d.errs, posError{rng, err})
	}
	return diags.HasErrors()
}

// lowerFirst makes HCL's capitalized messages read like the rest, leaving
// acronyms alone.
func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	r, n := utf8.DecodeRuneInString(s)
	if next, _ := utf8.DecodeRuneInString(s[n:]); unicode.IsUpper(next) {
		return s
	}
	return string(unicode.ToLower(r)) + s[n:]
}

// rangeOf finds where field was written, falling back to the closest
// enclosing block; the zero Range when the field comes from the defaults.
func (d *decoder) rangeOf(field string) hcl.Range {
	for f := field; f != ""; {
		if rng, ok := d.ranges[f]; ok {
			return rng
		}
		i := strings.LastIndexAny(f, ".[")
		if i < 0 {
			break
		}
		f = f[:i]
	}
	return hcl.Range{}
}

// block decodes b's body against the schema made of attrs and blocks,
// recording b's position under field.
func (d *decoder) block(field string, b *hcl.Block, attrs []string, blocks ...hcl.BlockHeaderSchema) *hcl.BodyContent {
	d.ranges[field] = b.DefRange
	return d.content(field, b.Body, attrs, blocks...)
}

func (d *decoder) content(field string, body hcl.Body, attrs []string, blocks ...hcl.BlockHeaderSchema) *hcl.BodyContent {
	schema := &hcl.BodySchema{Blocks: blocks}
	for _, a := range attrs {
		schema.Attributes = append(schema.Attributes, hcl.AttributeSchema{Name: a})
	}
	content, diags := body.Content(schema)
	d.diags(field, diags)
	return content
}

// unique indexes blocks by type, rejecting a type given twice.
func (d *decoder) unique(prefix string, blocks hcl.Blocks) map[string]*hcl.Block {
	m := map[string]*hcl.Block{}
	for _, b := range blocks {
		if first := m[b.Type]; first != nil {
			d.failf(prefix+b.Type, b.DefRange, "only one such block is allowed; the first is at line %d", first.DefRange.Start.Line)
			continue
		}
		m[b.Type] = b
	}
	return m
}

func (d *decoder) root(body hcl.Body, c *Config) {
	content := d.content("", body, []string{"state_dir", "log_level", "log_format"},
		hcl.BlockHeaderSchema{Type: "socket"},
		hcl.BlockHeaderSchema{Type: "backend", LabelNames: []string{"kind"}},
		hcl.BlockHeaderSchema{Type: "leases"},
		hcl.BlockHeaderSchema{Type: "limits"},
		hcl.BlockHeaderSchema{Type: "acl"},
		hcl.BlockHeaderSchema{Type: "metrics"},
	)
	a := content.Attributes
	d.str("state_dir", a["state_dir"], &c.StateDir)
	d.str("log_level", a["log_level"], &c.LogLevel)
	d.str("log_format", a["log_format"], &c.LogFormat)

	blocks := d.unique("", content.Blocks)
	if b := blocks["socket"]; b != nil {
		a := d.block("socket", b, []string{"path", "mode", "group"}).Attributes
		d.str("socket.path", a["path"], &c.Socket.Path)
		d.mode("socket.mode", a["mode"], &c.Socket.Mode)
		if attr := a["group"]; attr != nil {
			if v, ok := d.eval("socket.group", attr); ok {
				d.group("socket.group", attr.Expr.Range(), v, &c.Socket.Group)
			}
		}
	}
	if b := blocks["backend"]; b != nil {
		d.backend(b, &c.Backend)
	}
	if b := blocks["leases"]; b != nil {
		a := d.block("leases", b, []string{"default_ttl", "min_ttl", "max_ttl"}).Attributes
		d.duration("leases.default_ttl", a["default_ttl"], &c.Leases.DefaultTTL)
		d.duration("leases.min_ttl", a["min_ttl"], &c.Leases.MinTTL)
		d.duration("leases.max_ttl", a["max_ttl"], &c.Leases.MaxTTL)
	}
	if b := blocks["limits"]; b != nil {
		a := d.block("limits", b, []string{"max_sessions", "max_leases_per_session", "max_waiters", "max_line_bytes"}).Attributes
		d.integer("limits.max_sessions", a["max_sessions"], &c.Limits.MaxSessions)
		d.integer("limits.max_leases_per_session", a["max_leases_per_session"], &c.Limits.MaxLeasesPerSession)
		d.integer("limits.max_waiters", a["max_waiters"], &c.Limits.MaxWaiters)
		d.integer("limits.max_line_bytes", a["max_line_bytes"], &c.Limits.MaxLineBytes)
	}
	if b := blocks["acl"]; b != nil {
		c.ACL = d.acl(b)
	}
	if b := blocks["metrics"]; b != nil {
		a := d.block("metrics", b, []string{"address"}).Attributes
		d.str("metrics.address", a["address"], &c.Metrics.Address)
	}
}

func (d *decoder) backend(b *hcl.Block, be *Backend) {
	d.ranges["backend"] = b.DefRange
	kind := b.Labels[0]
	field := fmt.Sprintf("backend %q", kind)
	switch kind {
	case "memory":
		d.block(field, b, nil)
		*be = Backend{Kind: "memory"}
	case "redis":
		content := d.block(field, b, []string{"addresses", "master_name", "cluster", "username", "password", "password_file", "db", "key_prefix"},
			hcl.BlockHeaderSchema{Type: "tls"})
		a := content.Attributes
		if attr := a["password"]; attr != nil {
			// Listed in the schema only to explain why it is refused.
			d.failf(field+".password", attr.NameRange, "a password is never written in the config; put it in a file and set password_file")
		}
		r := &Redis{KeyPrefix: "lockagent"}
		d.strs(field+".addresses", a["addresses"], &r.Addresses)
		d.str(field+".master_name", a["master_name"], &r.MasterName)
		d.boolean(field+".cluster", a["cluster"], &r.Cluster)
		d.str(field+".username", a["username"], &r.Username)
		d.str(field+".password_file", a["password_file"], &r.PasswordFile)
		d.integer(field+".db", a["db"], &r.DB)
		d.str(field+".key_prefix", a["key_prefix"], &r.KeyPrefix)
		if tb := d.unique(field+".", content.Blocks)["tls"]; tb != nil {
			a := d.block(field+".tls", tb, []string{"ca_file", "cert_file", "key_file"}).Attributes
			r.TLS = &TLS{}
			d.str(field+".tls.ca_file", a["ca_file"], &r.TLS.CAFile)
			d.str(field+".tls.cert_file", a["cert_file"], &r.TLS.CertFile)
			d.str(field+".tls.key_file", a["key_file"], &r.TLS.KeyFile)
		}
		*be = Backend{Kind: "redis", Redis: r}
	default:
		d.failf("backend", b.LabelRanges[0], "unknown kind %q; want memory or redis", kind)
	}
}

func (d *decoder) acl(b *hcl.Block) *ACL {
	content := d.block("acl", b, []string{"admin_uids", "admin_groups"},
		hcl.BlockHeaderSchema{Type: "rule", LabelNames: []string{"pattern"}})
	acl := &ACL{}
	d.uids("acl.admin_uids", content.Attributes["admin_uids"], &acl.AdminUIDs)
	d.groups("acl.admin_groups", content.Attributes["admin_groups"], &acl.AdminGroups)
	first := map[string]*hcl.Block{}
	for _, rb := range content.Blocks {
		pattern := rb.Labels[0]
		field := rulePath(pattern)
		if f := first[pattern]; f != nil {
			d.failf(field, rb.LabelRanges[0], "duplicate rule; the first is at line %d", f.DefRange.Start.Line)
			continue
		}
		first[pattern] = rb
		a := d.block(field, rb, []string{"uids", "groups", "modes"}).Attributes
		rule := Rule{Pattern: pattern}
		d.uids(field+".uids", a["uids"], &rule.UIDs)
		d.groups(field+".groups", a["groups"], &rule.Groups)
		d.strs(field+".modes", a["modes"], &rule.Modes)
		acl.Rules = append(acl.Rules, rule)
	}
	return acl
}

// eval evaluates attr, which may use neither variables nor functions, and
// records its position under field.
func (d *decoder) eval(field string, attr *hcl.Attribute) (cty.Value, bool) {
	d.ranges[field] = attr.Expr.Range()
	v, diags := attr.Expr.Value(nil)
	if d.diags(field, diags) {
		return cty.NilVal, false
	}
	return v, true
}

// str decodes a string attribute into dst and reports whether it did.
func (d *decoder) str(field string, attr *hcl.Attribute, dst *string) bool {
	if attr == nil {
		return false
	}
	v, ok := d.eval(field, attr)
	if !ok {
		return false
	}
	if v.IsNull() || v.Type() != cty.String {
		d.failf(field, attr.Expr.Range(), "must be a string")
		return false
	}
	*dst = v.AsString()
	return true
}

func (d *decoder) duration(field string, attr *hcl.Attribute, dst *time.Duration) {
	var s string
	if !d.str(field, attr, &s) {
		return
	}
	dur, err := time.ParseDuration(s)
	if err != nil {
		d.failf(field, attr.Expr.Range(), "%q is not a duration", s)
		return
	}
	*dst = dur
}

func (d *decoder) mode(field string, attr *hcl.Attribute, dst *os.FileMode) {
	var s string
	if !d.str(field, attr, &s) {
		return
	}
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		d.failf(field, attr.Expr.Range(), `%q is not an octal mode like "0660"`, s)
		return
	}
	*dst = os.FileMode(n)
}

func (d *decoder) integer(field string, attr *hcl.Attribute, dst *int) {
	if attr == nil {
		return
	}
	v, ok := d.eval(field, attr)
	if !ok {
		return
	}
	n, ok := wholeNumber(v, math.MinInt, math.MaxInt)
	if !ok {
		d.failf(field, attr.Expr.Range(), "must be a whole number")
		return
	}
	*dst = int(n)
}

func (d *decoder) boolean(field string, attr *hcl.Attribute, dst *bool) {
	if attr == nil {
		return
	}
	v, ok := d.eval(field, attr)
	if !ok {
		return
	}
	if v.IsNull() || v.Type() != cty.Bool {
		d.failf(field, attr.Expr.Range(), "must be true or false")
		return
	}
	*dst = v.True()
}

// list decodes a list attribute, calling each for every element with the
// element's field path and position. The result of an empty list is an empty
// slice, not nil.
func (d *decoder) list(field string, attr *hcl.Attribute, each func(field string, rng hcl.Range, v cty.Value)) bool {
	if attr == nil {
		return false
	}
	v, ok := d.eval(field, attr)
	if !ok {
		return false
	}
	if v.IsNull() || !(v.Type().IsTupleType() || v.Type().IsListType()) {
		d.failf(field, attr.Expr.Range(), "must be a list")
		return false
	}
	tuple, _ := attr.Expr.(*hclsyntax.TupleConsExpr)
	for i, elem := range v.AsValueSlice() {
		rng := attr.Expr.Range()
		if tuple != nil && i < len(tuple.Exprs) {
			rng = tuple.Exprs[i].Range()
		}
		elemField := fmt.Sprintf("%s[%d]", field, i)
		d.ranges[elemField] = rng
		each(elemField, rng, elem)
	}
	return true
}

func (d *decoder) strs(field string, attr *hcl.Attribute, dst *[]string) {
	out := []string{}
	if d.list(field, attr, func(field string, rng hcl.Range, v cty.Value) {
		if v.IsNull() || v.Type() != cty.String {
			d.failf(field, rng, "must be a string")
			return
		}
		out = append(out, v.AsString())
	}) {
		*dst = out
	}
}

func (d *decoder) uids(field string, attr *hcl.Attribute, dst *[]uint32) {
	out := []uint32{}
	if d.list(field, attr, func(field string, rng hcl.Range, v cty.Value) {
		n, ok := wholeNumber(v, 0, math.MaxUint32)
		if !ok {
			d.failf(field, rng, "must be a uid, a whole number from 0 to %d", uint32(math.MaxUint32))
			return
		}
		out = append(out, uint32(n))
	}) {
		*dst = out
	}
}

func (d *decoder) groups(field string, attr *hcl.Attribute, dst *[]string) {
	out := []string{}
	if d.list(field, attr, func(field string, rng hcl.Range, v cty.Value) {
		var g string
		d.group(field, rng, v, &g)
		out = append(out, g)
	}) {
		*dst = out
	}
}

// group decodes a group given by name (a string) or by gid (a string or a
// number).
func (d *decoder) group(field string, rng hcl.Range, v cty.Value, dst *string) {
	if !v.IsNull() && v.Type() == cty.String {
		*dst = v.AsString()
		return
	}
	n, ok := wholeNumber(v, 0, math.MaxUint32)
	if !ok {
		d.failf(field, rng, "must be a group name or gid")
		return
	}
	*dst = strconv.FormatInt(n, 10)
}

// wholeNumber returns v as an integer when it is a number without a fraction
// within [lo, hi].
func wholeNumber(v cty.Value, lo, hi int64) (int64, bool) {
	if v.IsNull() || v.Type() != cty.Number {
		return 0, false
	}
	n, acc := v.AsBigFloat().Int64()
	return n, acc == big.Exact && n >= lo && n <= hi
}

// Render returns c as an HCL config file, in the layout of the documented
// example, with every value spelled out: loading the text gives back c.
func (c Config) Render() string {
	var b strings.Builder
	b.WriteString("socket {\n")
	attrs(&b, "  ", "path", quote(c.Socket.Path), "mode", fmt.Sprintf(`"%04o"`, uint32(c.Socket.Mode)), "group", quote(c.Socket.Group))
	b.WriteString("}\n\n")
	attrs(&b, "", "state_dir", quote(c.StateDir), "log_level", quote(c.LogLevel), "log_format", quote(c.LogFormat))
	b.WriteString("\n")

	if r := c.Backend.Redis; r != nil {
		fmt.Fprintf(&b, "backend %s {\n", quote(c.Backend.Kind))
		attrs(&b, "  ",
			"addresses", list(r.Addresses, quote),
			"master_name", quote(r.MasterName),
			"cluster", strconv.FormatBool(r.Cluster),
			"username", quote(r.Username),
			"password_file", quote(r.PasswordFile),
			"db", strconv.Itoa(r.DB),
			"key_prefix", quote(r.KeyPrefix))
		if t := r.TLS; t != nil {
			b.WriteString("\n  tls {\n")
			attrs(&b, "    ", "ca_file", quote(t.CAFile), "cert_file", quote(t.CertFile), "key_file", quote(t.KeyFile))
			b.WriteString("  }\n")
		}
		b.WriteString("}\n\n")
	} else {
		fmt.Fprintf(&b, "backend %s {}\n\n", quote(c.Backend.Kind))
	}

	b.WriteString("leases {\n")
	attrs(&b, "  ",
		"default_ttl", quote(formatDuration(c.Leases.DefaultTTL)),
		"min_ttl", quote(formatDuration(c.Leases.MinTTL)),
		"max_ttl", quote(formatDuration(c.Leases.MaxTTL)))
	b.WriteString("}\n\n")

	b.WriteString("limits {\n")
	attrs(&b, "  ",
		"max_sessions", strconv.Itoa(c.Limits.MaxSessions),
		"max_leases_per_session", strconv.Itoa(c.Limits.MaxLeasesPerSession),
		"max_waiters", strconv.Itoa(c.Limits.MaxWaiters),
		"max_line_bytes", strconv.Itoa(c.Limits.MaxLineBytes))
	b.WriteString("}\n\n")

	if a := c.ACL; a != nil {
		b.WriteString("acl {\n")
		var kv []string
		if a.AdminUIDs != nil {
			kv = append(kv, "admin_uids", list(a.AdminUIDs, formatUID))
		}
		if a.AdminGroups != nil {
			kv = append(kv, "admin_groups", list(a.AdminGroups, quote))
		}
		attrs(&b, "  ", kv...)
		for i, r := range a.Rules {
			if i > 0 || len(kv) > 0 {
				b.WriteString("\n")
			}
			var ruleKV []string
			if r.UIDs != nil {
				ruleKV = append(ruleKV, "uids", list(r.UIDs, formatUID))
			}
			if r.Groups != nil {
				ruleKV = append(ruleKV, "groups", list(r.Groups, quote))
			}
			if r.Modes != nil {
				ruleKV = append(ruleKV, "modes", list(r.Modes, quote))
			}
			if len(ruleKV) == 0 {
				fmt.Fprintf(&b, "  rule %s {}\n", quote(r.Pattern))
				continue
			}
			fmt.Fprintf(&b, "  rule %s {\n", quote(r.Pattern))
			attrs(&b, "    ", ruleKV...)
			b.WriteString("  }\n")
		}
		b.WriteString("}\n\n")
	} else {
		b.WriteString("# no acl: whoever can open the socket may lock any name\n\n")
	}

	if c.Metrics.Address != "" {
		b.WriteString("metrics {\n")
		attrs(&b, "  ", "address", quote(c.Metrics.Address))
		b.WriteString("}\n")
	} else {
		b.WriteString("# no metrics: the endpoint is off\n")
	}
	return b.String()
}

// attrs writes name = value lines, kv alternating names and rendered values,
// with the equals signs aligned.
func attrs(b *strings.Builder, indent string, kv ...string) {
	width := 0
	for i := 0; i < len(kv); i += 2 {
		width = max(width, len(kv[i]))
	}
	for i := 0; i < len(kv); i += 2 {
		fmt.Fprintf(b, "%s%-*s = %s\n", indent, width, kv[i], kv[i+1])
	}
}

func list[T any](items []T, format func(T) string) string {
	parts := make([]string, len(items))
	for i, item := range items {
		parts[i] = format(item)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func formatUID(uid uint32) string { return strconv.FormatUint(uint64(uid), 10) }

// formatDuration is time.Duration.String without zero trailing units:
// "24h", not "24h0m0s". Both parse to the same duration.
func formatDuration(d time.Duration) string {
	s := d.String()
	s, ok := strings.CutSuffix(s, "m0s")
	if !ok {
		return s
	}
	if h, ok := strings.CutSuffix(s, "h0"); ok {
		return h + "h"
	}
	return s + "m"
}

// quote returns s as an HCL quoted string. Unlike strconv.Quote it escapes
// the template introducers "${" and "%{", and uses only HCL's escapes.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case (r == '$' || r == '%') && strings.HasPrefix(s[i+1:], "{"):
			b.WriteRune(r)
			b.WriteRune(r)
		case unicode.IsControl(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
