package config

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/socketpath"
)

// The example files use groups that exist on any Linux host: "root" and gids.

func TestLoadGood(t *testing.T) {
	tests := map[string]Config{
		"empty.hcl": Default(),
		"memory.hcl": {
			Socket:    Socket{Path: "/run/lockagent/agent.sock", Mode: 0o660, Group: "root"},
			StateDir:  "/var/lib/lockagent",
			LogLevel:  "info",
			LogFormat: "text",
			Backend:   Backend{Kind: "memory"},
			Leases:    Leases{DefaultTTL: 15 * time.Second, MinTTL: time.Second, MaxTTL: 24 * time.Hour},
			Limits:    Limits{MaxSessions: 10000, MaxLeasesPerSession: 1000, MaxWaiters: 10000, MaxLineBytes: 65536, MaxOutputBytes: 64 << 20, MaxOutputBytesPerUID: 16 << 20},
			ACL: &ACL{
				AdminUIDs:   []uint32{0},
				AdminGroups: []string{"root"},
				Rules: []Rule{{
					Pattern: "orders/*",
					UIDs:    []uint32{1001},
					Groups:  []string{"root", "1001"},
					Modes:   []string{"exclusive", "shared"},
				}},
			},
			Metrics: Metrics{Address: "127.0.0.1:9464"},
		},
		"etcd.hcl": func() Config {
			c := Default()
			c.Backend = Backend{Kind: "etcd", Etcd: &Etcd{
				Endpoints:          []string{"10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"},
				KeyPrefix:          "locks",
				Username:           "lockagent",
				PasswordCredential: "etcd.password",
				DialTimeout:        2 * time.Second,
				RequestTimeout:     3 * time.Second,
				TLS: &TLS{
					CAFile:   "/etc/lockagent/etcd-ca.pem",
					CertFile: "/etc/lockagent/etcd-client.pem",
					KeyFile:  "/etc/lockagent/etcd-client.key",
				},
			}}
			return c
		}(),
		"redis.hcl": {
			Socket:    Socket{Path: "/run/lockagent/agent.sock", Mode: 0o600, Group: ""},
			StateDir:  "/srv/lockagent/state",
			LogLevel:  "debug",
			LogFormat: "json",
			Backend: Backend{Kind: "redis", Redis: &Redis{
				Addresses:            []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"},
				MasterName:           "locks",
				Username:             "lockagent",
				PasswordFile:         "/etc/lockagent/redis.password",
				SentinelUsername:     "watcher",
				SentinelPasswordFile: "/etc/lockagent/sentinel.password",
				DB:                   2,
				KeyPrefix:            "locks",
				WaitReplicas:         1,
				WaitTimeout:          250 * time.Millisecond,
				TLS: &TLS{
					CAFile:   "/etc/lockagent/ca.pem",
					CertFile: "/etc/lockagent/client.pem",
					KeyFile:  "/etc/lockagent/client.key",
				},
			}},
			Leases: Leases{DefaultTTL: 30 * time.Second, MinTTL: 500 * time.Millisecond, MaxTTL: 90 * time.Minute},
			Limits: Limits{MaxSessions: 500, MaxLeasesPerSession: 50, MaxWaiters: 2000, MaxLineBytes: 1 << 20,
				MaxConnectionsPerUID: 100, MaxSessionsPerUID: 200, MaxLeasesPerUID: 20,
				MaxOutputBytes: 32 << 20, MaxOutputBytesPerUID: 4 << 20},
			ACL: &ACL{
				AdminUIDs:   []uint32{},
				AdminGroups: []string{"0"},
				Rules: []Rule{
					{Pattern: "orders/*", UIDs: []uint32{1001, 1002}, Modes: []string{"exclusive"}},
					{Pattern: "reports/??", Groups: []string{"root"}},
					{Pattern: "*"},
				},
			},
		},
	}
	for name, want := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Load(filepath.Join("testdata", "good", name))
			require.NoError(t, err)
			assert.Equal(t, want, got)
		})
	}
}

func TestLoadBad(t *testing.T) {
	// Each file in testdata/bad and the error it gives, after its path.
	wants := map[string]string{
		"backend-kind.hcl":         `:1,9: backend: unknown kind "consul"; want memory, redis or etcd`,
		"etcd-credential.hcl":      `:5,25: backend "etcd".password_credential: password_file and password_credential exclude each other`,
		"etcd-endpoint.hcl":        `:2,33: backend "etcd".endpoints[1]: "http://10.0.0.2:2379" is not host:port`,
		"etcd-key-prefix.hcl":      `:3,16: backend "etcd".key_prefix: must not be empty`,
		"etcd-no-endpoints.hcl":    `:1,1: backend "etcd".endpoints: must list at least one host:port`,
		"etcd-password.hcl":        `:4,3: backend "etcd".password: a password is never written in the config; put it in a file and set password_file, or in a systemd credential and set password_credential`,
		"etcd-timeout.hcl":         `:3,21: backend "etcd".request_timeout: 10ms is not between 100ms and 1m`,
		"etcd-tls.hcl":             `:4,3: backend "etcd".tls: cert_file and key_file go together`,
		"etcd-username.hcl":        `:3,15: backend "etcd".username: needs password_file or password_credential`,
		"backend-no-label.hcl":     `:1,9: missing kind for backend`,
		"default-below-min.hcl":    `:1,1: leases.default_ttl: 15s is below min_ttl 20s`,
		"duplicate-block.hcl":      `:5,1: socket: only one such block is allowed; the first is at line 1`,
		"duplicate-rule.hcl":       `:5,8: acl.rule "orders/*": duplicate rule; the first is at line 2`,
		"duration.hcl":             `:2,17: leases.default_ttl: "15x" is not a duration`,
		"limit-fraction.hcl":       `:2,17: limits.max_waiters: must be a whole number`,
		"limit-type.hcl":           `:2,17: limits.max_waiters: must be a whole number`,
		"log-format.hcl":           `:1,14: log_format: "logfmt" is not text or json`,
		"log-level.hcl":            `:1,13: log_level: "verbose" is not one of trace, debug, info, warn, error`,
		"max-line-bytes.hcl":       `:2,20: limits.max_line_bytes: 100 is not between 1024 and 16777216`,
		"max-sessions.hcl":         `:2,18: limits.max_sessions: 0 is below 1`,
		"output-bytes.hcl":         `:2,22: limits.max_output_bytes: 1000 is below 1048576`,
		"output-bytes-per-uid.hcl": `:2,30: limits.max_output_bytes_per_uid: 67108865 is above max_output_bytes 67108864`,
		"max-ttl.hcl":              `:2,13: leases.max_ttl: 48h is above 24h`,
		"metrics-address.hcl":      `:2,13: metrics.address: "9464" is not host:port`,
		"metrics-port.hcl":         `:2,13: metrics.address: "127.0.0.1:99999": port "99999" is not a port number or a known service`,
		"min-ttl.hcl":              `:2,13: leases.min_ttl: 10ms is below 100ms`,
		"mode-number.hcl":          `:2,10: socket.mode: must be a string`,
		"mode-range.hcl":           `:2,10: socket.mode: 1777 has bits beyond 0777`,
		"mode-syntax.hcl":          `:2,10: socket.mode: "rw-rw----" is not an octal mode like "0660"`,
		"redis-address.hcl":        `:2,36: backend "redis".addresses[1]: "10.0.0.2" is not host:port`,
		"redis-cluster-db.hcl":     `:4,15: backend "redis".db: must be 0 with Redis Cluster`,
		"redis-no-addresses.hcl":   `:1,1: backend "redis".addresses: must list at least one host:port`,
		"redis-password.hcl":       `:3,3: backend "redis".password: a password is never written in the config; put it in a file and set password_file, or in a systemd credential and set password_credential`,
		"redis-credential.hcl":     `:4,25: backend "redis".password_credential: password_file and password_credential exclude each other`,
		"sentinel-password.hcl":    `:4,3: backend "redis".sentinel_password: a password is never written in the config; put it in a file and set sentinel_password_file, or in a systemd credential and set sentinel_password_credential`,
		"sentinel-credential.hcl":  `:5,34: backend "redis".sentinel_password_credential: sentinel_password_file and sentinel_password_credential exclude each other`,
		"sentinel-standalone.hcl":  `:3,23: backend "redis".sentinel_username: only with Sentinel (master_name)`,
		"per-uid-limit.hcl":        `:2,29: limits.max_connections_per_uid: -1 is below 0 (0: no cap per uid)`,
		"per-uid-sessions.hcl":     `:2,26: limits.max_sessions_per_uid: -3 is below 0 (0: no cap per uid)`,
		"redis-key-prefix.hcl":     `:3,16: backend "redis".key_prefix: must not hold { or }`,
		"redis-several.hcl":        `:2,15: backend "redis".addresses: several addresses need master_name (Sentinel) or cluster = true`,
		"redis-tls.hcl":            `:4,3: backend "redis".tls: cert_file and key_file go together`,
		"rule-empty-modes.hcl":     `:3,13: acl.rule "orders/*".modes: must not be empty; leave it out to allow every mode`,
		"rule-empty-pattern.hcl":   `:2,3: acl.rule "": the pattern must not be empty`,
		"rule-mode.hcl":            `:3,27: acl.rule "orders/*".modes[1]: "read" is not exclusive or shared`,
		"single-line-block.hcl":    `:3,22: invalid single-argument block definition`,
		"socket-group.hcl":         `:2,11: socket.group: unknown group "no-such-group-for-lockagent"`,
		"socket-path.hcl":          `:2,10: socket.path: "agent.sock" is not an absolute path`,
		"syntax.hcl":               `:1,8: unclosed configuration block`,
		"ttl-fraction.hcl":         `:2,17: leases.default_ttl: 1.0005s is not a whole number of milliseconds`,
		"ttl-order.hcl":            `:3,17: leases.default_ttl: 2m is above max_ttl 1m`,
		"two-backends.hcl":         `:3,1: backend: only one such block is allowed; the first is at line 1`,
		"uid.hcl":                  `:2,20: acl.admin_uids[1]: must be a uid, a whole number from 0 to 4294967295`,
		"unknown-attribute.hcl":    `:3,3: socket: unsupported argument: an argument named "owner" is not expected here`,
		"unknown-block.hcl":        `:3,1: unsupported block type: blocks of type "cache" are not expected here`,
		"unknown-group.hcl":        `:2,27: acl.admin_groups[1]: unknown group "no-such-group-for-lockagent"`,
		"variable.hcl":             `:1,13: state_dir: variables not allowed`,
	}
	files, err := filepath.Glob(filepath.Join("testdata", "bad", "*.hcl"))
	require.NoError(t, err)
	require.Len(t, files, len(wants), "every file in testdata/bad needs an entry here, and every entry a file")
	for _, path := range files {
		name := filepath.Base(path)
		t.Run(name, func(t *testing.T) {
			want, ok := wants[name]
			require.True(t, ok, "no expected error for %s", name)
			_, err := Load(path)
			require.ErrorContains(t, err, path+want)
			assert.NotContains(t, err.Error(), "\n", "one problem, one line")
		})
	}
}

func TestLoadReportsEveryProblemInFileOrder(t *testing.T) {
	path := writeFile(t, `
limits {
  max_waiters = 0
}

log_level = "loud"

socket {
  colour = "blue"
}
`)
	_, err := Load(path)
	require.EqualError(t, err, strings.Join([]string{
		path + `:9,3: socket: unsupported argument: an argument named "colour" is not expected here`,
	}, "\n"), "decoding errors stop before validation")

	path = writeFile(t, `
limits {
  max_waiters = 0
}

log_level = "loud"
`)
	_, err = Load(path)
	require.EqualError(t, err, strings.Join([]string{
		path + `:3,17: limits.max_waiters: 0 is below 1`,
		path + `:6,13: log_level: "loud" is not one of trace, debug, info, warn, error`,
	}, "\n"))
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "absent.hcl"))
	require.ErrorIs(t, err, fs.ErrNotExist)
}

func TestValidate(t *testing.T) {
	valid := validConfig()
	require.NoError(t, valid.Validate())

	tests := map[string]struct {
		change func(*Config)
		want   string
	}{
		"state dir unset": {
			func(c *Config) { c.StateDir = "" },
			"state_dir: must be set; the default needs $XDG_STATE_HOME or $HOME",
		},
		"socket path too long": {
			func(c *Config) { c.Socket.Path = "/" + strings.Repeat("s", 107) },
			"socket.path: is 108 bytes long; a socket path has at most 107",
		},
		"socket path a directory": {
			func(c *Config) { c.Socket.Path = "/" },
			`socket.path: "/" names a directory, not a socket file`,
		},
		"socket path ending in a slash": {
			func(c *Config) { c.Socket.Path = "/run/lockagent/" },
			`socket.path: "/run/lockagent/" names a directory, not a socket file`,
		},
		"socket mode type bits": {
			func(c *Config) { c.Socket.Mode = os.ModeSocket | 0o660 },
			"socket.mode: 100000660 has bits beyond 0777",
		},
		"redis without settings": {
			func(c *Config) { c.Backend = Backend{Kind: "redis"} },
			"backend: the redis backend has no settings",
		},
		"memory with redis settings": {
			func(c *Config) { c.Backend.Redis = &Redis{} },
			"backend: redis settings given for the memory backend",
		},
		"unknown backend": {
			func(c *Config) { c.Backend = Backend{Kind: "consul"} },
			`backend: unknown kind "consul"; want memory, redis or etcd`,
		},
		"etcd without settings": {
			func(c *Config) { c.Backend = Backend{Kind: "etcd"} },
			"backend: the etcd backend has no settings",
		},
		"memory with etcd settings": {
			func(c *Config) { c.Backend.Etcd = &Etcd{} },
			"backend: etcd settings given for the memory backend",
		},
		"etcd with redis settings": {
			func(c *Config) {
				c.Backend = Backend{Kind: "etcd", Redis: &Redis{}, Etcd: &Etcd{Endpoints: []string{"a:1"}, KeyPrefix: "k", DialTimeout: time.Second, RequestTimeout: time.Second}}
			},
			"backend: redis settings given for the etcd backend",
		},
		"etcd password without a user": {
			func(c *Config) {
				c.Backend = Backend{Kind: "etcd", Etcd: &Etcd{Endpoints: []string{"a:1"}, KeyPrefix: "k", PasswordFile: "/p", DialTimeout: time.Second, RequestTimeout: time.Second}}
			},
			`backend "etcd".username: must be set with a password`,
		},
		"etcd dial timeout too long": {
			func(c *Config) {
				c.Backend = Backend{Kind: "etcd", Etcd: &Etcd{Endpoints: []string{"a:1"}, KeyPrefix: "k", DialTimeout: time.Hour, RequestTimeout: time.Second}}
			},
			`backend "etcd".dial_timeout: 1h is not between 100ms and 1m`,
		},
		"cluster and sentinel": {
			func(c *Config) {
				c.Backend = Backend{Kind: "redis", Redis: &Redis{Addresses: []string{"a:1"}, Cluster: true, MasterName: "m", KeyPrefix: "k", WaitTimeout: time.Second}}
			},
			`backend "redis".cluster: Redis Cluster and Sentinel (master_name) exclude each other`,
		},
		"negative wait_replicas": {
			func(c *Config) {
				c.Backend = Backend{Kind: "redis", Redis: &Redis{Addresses: []string{"a:1"}, KeyPrefix: "k", WaitReplicas: -1, WaitTimeout: time.Second}}
			},
			`backend "redis".wait_replicas: -1 is below 0`,
		},
		"wait_replicas on cluster": {
			func(c *Config) {
				c.Backend = Backend{Kind: "redis", Redis: &Redis{Addresses: []string{"a:1"}, Cluster: true, KeyPrefix: "k", WaitReplicas: 1, WaitTimeout: time.Second}}
			},
			`backend "redis".wait_replicas: is not supported with Redis Cluster`,
		},
		"wait_timeout out of range without wait_replicas": {
			func(c *Config) {
				c.Backend = Backend{Kind: "redis", Redis: &Redis{Addresses: []string{"a:1"}, KeyPrefix: "k", WaitTimeout: -5 * time.Second}}
			},
			`backend "redis".wait_timeout: -5s is not between 1ms and 10s`,
		},
		"wait_timeout too long": {
			func(c *Config) {
				c.Backend = Backend{Kind: "redis", Redis: &Redis{Addresses: []string{"a:1"}, KeyPrefix: "k", WaitReplicas: 1, WaitTimeout: time.Minute}}
			},
			`backend "redis".wait_timeout: 1m0s is not between 1ms and 10s`,
		},
		"duplicate rule": {
			func(c *Config) { c.ACL = &ACL{Rules: []Rule{{Pattern: "a/*"}, {Pattern: "a/*"}}} },
			`acl.rule "a/*": duplicate rule`,
		},
		"empty rule uids": {
			func(c *Config) { c.ACL = &ACL{Rules: []Rule{{Pattern: "a/*", UIDs: []uint32{}}}} },
			`acl.rule "a/*".uids: must not be empty; leave it out to match every uid`,
		},
		"empty group name": {
			func(c *Config) { c.ACL = &ACL{AdminGroups: []string{""}} },
			`acl.admin_groups[0]: a group must not be empty`,
		},
		"min above max": {
			func(c *Config) {
				c.Leases = Leases{DefaultTTL: time.Second, MinTTL: 2 * time.Second, MaxTTL: time.Second}
			},
			"leases.max_ttl: 1s is below min_ttl 2s",
		},
		"two problems": {
			func(c *Config) { c.LogFormat = "xml"; c.Limits.MaxWaiters = -1 },
			"log_format: \"xml\" is not text or json\nlimits.max_waiters: -1 is below 1",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := validConfig()
			tc.change(&c)
			assert.EqualError(t, c.Validate(), tc.want)
		})
	}
}

func TestRenderRoundTrip(t *testing.T) {
	configs := map[string]Config{
		"default": Default(),
		"odd strings": func() Config {
			c := validConfig()
			c.Socket.Path = `/tmp/lock "agent" ${x}.sock`
			c.StateDir = `/var/lib/lock\agent/%{if}/$${y}/$$`
			c.Backend = Backend{Kind: "redis", Redis: &Redis{Addresses: []string{"[::1]:6379"}, KeyPrefix: "k", TLS: &TLS{}, WaitTimeout: time.Second}}
			c.Leases = Leases{DefaultTTL: 1500 * time.Millisecond, MinTTL: 100 * time.Millisecond, MaxTTL: 90 * time.Minute}
			c.ACL = &ACL{
				AdminUIDs: []uint32{},
				Rules: []Rule{
					{Pattern: "tab\there\nnl\x01\x7f${*}%{?}$"},
					{Pattern: "ünïcode/*", Modes: []string{"shared"}},
				},
			}
			return c
		}(),
	}
	goods, err := filepath.Glob(filepath.Join("testdata", "good", "*.hcl"))
	require.NoError(t, err)
	for _, path := range goods {
		c, err := Load(path)
		require.NoError(t, err)
		configs[filepath.Base(path)] = c
	}
	for name, c := range configs {
		t.Run(name, func(t *testing.T) {
			text := c.Render()
			got, err := Load(writeFile(t, text))
			require.NoError(t, err, text)
			assert.Equal(t, c, got, text)
		})
	}
}

func TestRenderLayout(t *testing.T) {
	c, err := Load(filepath.Join("testdata", "good", "memory.hcl"))
	require.NoError(t, err)
	assert.Equal(t, `socket {
  path  = "/run/lockagent/agent.sock"
  mode  = "0660"
  group = "root"
}

state_dir  = "/var/lib/lockagent"
log_level  = "info"
log_format = "text"

backend "memory" {}

leases {
  default_ttl = "15s"
  min_ttl     = "1s"
  max_ttl     = "24h"
}

limits {
  max_sessions             = 10000
  max_leases_per_session   = 1000
  max_waiters              = 10000
  max_line_bytes           = 65536
  max_connections_per_uid  = 0
  max_sessions_per_uid     = 0
  max_leases_per_uid       = 0
  max_output_bytes         = 67108864
  max_output_bytes_per_uid = 16777216
}

acl {
  admin_uids   = [0]
  admin_groups = ["root"]

  rule "orders/*" {
    uids   = [1001]
    groups = ["root", "1001"]
    modes  = ["exclusive", "shared"]
  }
}

metrics {
  address = "127.0.0.1:9464"
}
`, c.Render())
}

func TestApplyEnv(t *testing.T) {
	c := validConfig()
	c.Socket.Path = "/from/config.sock"

	assert.Empty(t, c.ApplyEnv(func(string) string { return "" }))
	assert.Equal(t, "/from/config.sock", c.Socket.Path, "an empty variable changes nothing")

	over := c.ApplyEnv(env(map[string]string{"LOCKAGENT_SOCKET": "/from/env.sock"}))
	assert.Equal(t, "/from/env.sock", c.Socket.Path)
	assert.Equal(t, []Override{{Field: "socket.path", Source: "LOCKAGENT_SOCKET", Was: "/from/config.sock"}}, over,
		"what the environment set, and over what")
}

func TestDefaultSocketPath(t *testing.T) {
	assert.Equal(t, socketpath.Default(), Default().Socket.Path)
}

func TestDefaultStateDir(t *testing.T) {
	tests := []struct {
		name string
		euid int
		env  map[string]string
		want string
	}{
		{"root", 0, map[string]string{"XDG_STATE_HOME": "/root/.state"}, "/var/lib/lockagent"},
		{"xdg", 1000, map[string]string{"XDG_STATE_HOME": "/home/u/.state", "HOME": "/home/u"}, "/home/u/.state/lockagent"},
		{"home", 1000, map[string]string{"XDG_STATE_HOME": "relative", "HOME": "/home/u"}, "/home/u/.local/state/lockagent"},
		{"nowhere", 1000, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, defaultStateDir(tc.euid, env(tc.env)))
		})
	}
}

// FuzzLoad checks that no input makes Load panic, and that whatever it
// accepts renders to text that loads back to the same Config.
func FuzzLoad(f *testing.F) {
	for _, dir := range []string{"good", "bad"} {
		files, err := filepath.Glob(filepath.Join("testdata", dir, "*.hcl"))
		require.NoError(f, err)
		for _, path := range files {
			src, err := os.ReadFile(path)
			require.NoError(f, err)
			f.Add(src)
		}
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		c, err := parse(src, "fuzz.hcl")
		if err != nil {
			return
		}
		text := c.Render()
		got, err := parse([]byte(text), "rendered.hcl")
		require.NoError(t, err, text)
		assert.Equal(t, c, got, text)
	})
}

// validConfig is Default with the fields that depend on the environment
// pinned, so that it validates wherever the tests run.
func validConfig() Config {
	c := Default()
	c.Socket.Path = "/run/lockagent/agent.sock"
	c.StateDir = "/var/lib/lockagent"
	return c
}

func writeFile(tb testing.TB, text string) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "lockagent.hcl")
	require.NoError(tb, os.WriteFile(path, []byte(text), 0o600))
	return path
}

func env(vars map[string]string) func(string) string {
	return func(key string) string { return vars[key] }
}
