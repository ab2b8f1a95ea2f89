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
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/lockagent/lockagent/internal/socketpath"
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
	Kind  string // "memory", "redis" or "etcd"
	Redis *Redis // set exactly when Kind is "redis"
	Etcd  *Etcd  // set exactly when Kind is "etcd"
}

// Redis configures the Redis backend. One address is a standalone server;
// several with MasterName are Sentinels; Cluster uses Redis Cluster.
type Redis struct {
	Addresses    []string // host:port
	MasterName   string
	Cluster      bool
	Username     string
	PasswordFile string // the password is never written in the config itself
	// PasswordCredential names a systemd credential (LoadCredential=)
	// holding the password, read from $CREDENTIALS_DIRECTORY.
	PasswordCredential string
	// The sentinels' own credentials (Sentinel only), like the servers'.
	SentinelUsername           string
	SentinelPasswordFile       string
	SentinelPasswordCredential string
	DB                         int
	KeyPrefix                  string
	TLS                        *TLS // nil: plain TCP
	// WaitReplicas, when above 0, is how many replicas must have a grant
	// (Redis's WAIT) within WaitTimeout for it to be handed out; else it
	// is released and the acquire fails. Not with Cluster.
	WaitReplicas int
	WaitTimeout  time.Duration
}

// Etcd configures the etcd backend: the cluster's client endpoints, the
// key prefix, credentials and TLS, and the client's timeouts.
type Etcd struct {
	Endpoints []string // host:port of the members' client URLs
	KeyPrefix string
	Username  string
	// The password is never written in the config itself: a file, or a
	// systemd credential (LoadCredential=) from $CREDENTIALS_DIRECTORY.
	PasswordFile       string
	PasswordCredential string
	TLS                *TLS // nil: plain TCP
	// DialTimeout bounds the connection at start; RequestTimeout a
	// request that has no deadline of its own (inspect, leave).
	DialTimeout, RequestTimeout time.Duration
}

// TLS configures TLS to Redis or etcd. Empty CAFile means the system roots;
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
	// Caps per uid, on top of the global ones; 0: none.
	MaxConnectionsPerUID, MaxSessionsPerUID, MaxLeasesPerUID int
	// The memory that output not yet read by clients may take, in all
	// and for the connections of one uid.
	MaxOutputBytes, MaxOutputBytesPerUID int
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
	outputBytesFloor = 1 << 20                // room for a few answers and events
	socketPathBytes  = 107                    // sun_path on Linux, less its NUL
	// WAIT for replicas blocks the grant's connection this long at most.
	defaultWaitTimeout = 100 * time.Millisecond
	maxWaitTimeout     = 10 * time.Second
	// The etcd client's timeouts: long enough for a leader election (a
	// second or two), short enough that a dead cluster is seen.
	defaultEtcdTimeout = 5 * time.Second
	minEtcdTimeout     = 100 * time.Millisecond
	maxEtcdTimeout     = time.Minute
)

// Default returns the built-in configuration: what the agent runs with when
// there is no config file, and what a file is decoded on top of.
func Default() Config {
	return Config{
		Socket: Socket{
			// System agents share /run/lockagent; a user's agent lives in
			// that user's runtime directory.
			Path: socketpath.Default(),
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
			// No cap per uid beyond the global ones: set them where
			// several users share the agent, so that none can take it all.
			MaxConnectionsPerUID: 0,
			MaxSessionsPerUID:    0,
			MaxLeasesPerUID:      0,
			// Answers and events written but not yet read by clients:
			// beyond these, the connections furthest behind are cut off.
			MaxOutputBytes:       64 << 20,
			MaxOutputBytesPerUID: 16 << 20,
		},
		// No acl block: whoever can open the socket may lock any name.
		ACL: nil,
		// No metrics endpoint.
		Metrics: Metrics{Address: ""},
	}
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

// Override is a value that the environment or the command line gave, over
// the one the file, or the default, had: what `config check` tells apart
// from the file's.
type Override struct {
	Field  string // as in the file: "socket.path"
	Source string // "LOCKAGENT_SOCKET", "-socket"
	Was    string // the value it replaced
}

// ApplyEnv applies the environment's overrides, and returns them:
// LOCKAGENT_SOCKET, when set and not empty, replaces Socket.Path. Call
// Validate after every override.
func (c *Config) ApplyEnv(getenv func(string) string) []Override {
	var over []Override
	if path := getenv("LOCKAGENT_SOCKET"); path != "" {
		over = append(over, Override{"socket.path", "LOCKAGENT_SOCKET", c.Socket.Path})
		c.Socket.Path = path
	}
	return over
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
