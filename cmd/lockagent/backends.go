package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/backend/etcd"
	"github.com/lockagent/lockagent/backend/memory"
	"github.com/lockagent/lockagent/backend/redis"
	"github.com/lockagent/lockagent/config"
	"github.com/lockagent/lockagent/internal/rawsock"
)

// openBackend opens the backend the configuration names.
func openBackend(ctx context.Context, cfg config.Config, log hclog.Logger) (backend.Backend, error) {
	sec, err := readSecrets(cfg, os.Getenv)
	if err != nil {
		return nil, err
	}
	switch cfg.Backend.Kind {
	case "redis":
		return openRedis(ctx, cfg.Backend.Redis, sec, log)
	case "etcd":
		return openEtcd(ctx, cfg.Backend.Etcd, sec, log)
	}
	b, err := memory.Open(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// secrets are what a backend's settings name on the host: its passwords,
// from files or systemd credentials, and its TLS files.
type secrets struct {
	password, sentinelPassword string
	tls                        *tls.Config // nil: plain TCP
}

// readSecrets reads what the backend of cfg names on the host, as the
// agent does when it starts and `config check` does to say whether it
// would: its error names every file or credential it cannot read, and
// why; never a password.
func readSecrets(cfg config.Config, getenv func(string) string) (secrets, error) {
	var sec secrets
	var errs []error
	read := func(kind, prefix, file, credential string) string {
		pw, err := password(kind, prefix, file, credential, getenv)
		errs = append(errs, err)
		return pw
	}
	var t *config.TLS
	switch cfg.Backend.Kind {
	case "redis":
		rc := cfg.Backend.Redis
		sec.password = read("redis", "", rc.PasswordFile, rc.PasswordCredential)
		if rc.MasterName != "" {
			sec.sentinelPassword = read("redis", "sentinel_", rc.SentinelPasswordFile, rc.SentinelPasswordCredential)
		}
		t = rc.TLS
	case "etcd":
		ec := cfg.Backend.Etcd
		sec.password = read("etcd", "", ec.PasswordFile, ec.PasswordCredential)
		t = ec.TLS
	default:
		return sec, nil
	}
	if t != nil {
		var err error
		sec.tls, err = tlsConfig(cfg.Backend.Kind, t)
		errs = append(errs, err)
	}
	return sec, errors.Join(errs...)
}

// openEtcd connects to etcd, and checks that it answers.
func openEtcd(ctx context.Context, ec *config.Etcd, sec secrets, log hclog.Logger) (backend.Backend, error) {
	ecfg := clientv3.Config{
		Endpoints:   ec.Endpoints,
		DialTimeout: ec.DialTimeout,
		Username:    ec.Username,
		// A connection to a member that stopped answering is dropped
		// after a few seconds, and the requests go to the others.
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		// The client's own log (retries, endpoints) at its warnings.
		Logger: etcdLogger(log.Named("etcd-client")),
	}
	ecfg.Password, ecfg.TLS = sec.password, sec.tls
	cli, err := clientv3.New(ecfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, ec.DialTimeout+ec.RequestTimeout)
	defer cancel()
	return etcd.Open(ctx, etcd.Options{Client: cli, KeyPrefix: ec.KeyPrefix, RequestTimeout: ec.RequestTimeout, Logger: log})
}

// etcdLogger passes the etcd client's warnings and errors to log: its
// zap logger is the client's only way to say what it does.
func etcdLogger(log hclog.Logger) *zap.Logger {
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(hclogWriter{log}), zap.WarnLevel))
}

// hclogWriter writes the lines zap encodes as warnings of log.
type hclogWriter struct{ log hclog.Logger }

func (w hclogWriter) Write(p []byte) (int, error) {
	w.log.Warn(strings.TrimSpace(string(p)))
	return len(p), nil
}

// openRedis connects to Redis, loads the scripts and checks the server.
func openRedis(ctx context.Context, rc *config.Redis, sec secrets, log hclog.Logger) (backend.Backend, error) {
	goredis.SetLogger(goredisLog{log.Named("go-redis")})
	opts := &goredis.UniversalOptions{
		Addrs:         rc.Addresses,
		MasterName:    rc.MasterName,
		IsClusterMode: rc.Cluster,
		Username:      rc.Username,
		DB:            rc.DB,
		ClientName:    "lockagent",
		// Deadlines come from the agent's contexts: a renewal never waits
		// past its lease's local deadline.
		ContextTimeoutEnabled: true,
		DialTimeout:           2 * time.Second,
		ReadTimeout:           3 * time.Second,
		MaxRetries:            2,
		// Pipelines (renewals, calls gathered while one is in flight) use
		// the connections that single calls keep warm: a connection of a
		// pool of their own would be dialed on first use, paying a
		// handshake of several round trips in the middle of a renewal.
		PipelinePoolSize: -1,
	}
	opts.Password = sec.password
	// Connections read and write with raw system calls (see rawsock),
	// TLS over them if configured.
	opts.Dialer = rawsock.Dialer(opts.DialTimeout, sec.tls)
	if rc.MasterName != "" {
		opts.SentinelUsername, opts.SentinelPassword = rc.SentinelUsername, sec.sentinelPassword
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := redis.Open(ctx, redis.Options{Client: goredis.NewUniversalClient(opts), KeyPrefix: rc.KeyPrefix, Logger: log,
		WaitReplicas: rc.WaitReplicas, WaitTimeout: rc.WaitTimeout})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// goredisLog passes go-redis's own log lines to the agent's logger, so
// that they follow log_level and log_format: a line that tells of a
// failure is a warning, any other (a new primary, a sentinel found) is
// information.
type goredisLog struct{ log hclog.Logger }

func (g goredisLog) Printf(_ context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	lower := strings.ToLower(msg)
	if strings.Contains(lower, "fail") || strings.Contains(lower, "error") || strings.Contains(lower, "panic") {
		g.log.Warn(msg)
		return
	}
	g.log.Info(msg)
}

// tlsConfig builds the client TLS settings of a backend ("redis",
// "etcd") from the configured files.
func tlsConfig(kind string, t *config.TLS) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%s tls ca_file: %w", kind, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s tls ca_file %s: no certificate found", kind, t.CAFile)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s tls: %w", kind, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// password reads a backend's ("redis", "etcd") password from a file
// (the setting prefix + "password_file") or from the systemd credential
// a setting prefix + "password_credential" names; none is "". A trailing
// newline is not part of it. Errors name the file, never its content.
func password(kind, prefix, file, credential string, getenv func(string) string) (string, error) {
	path, field := file, prefix+"password_file"
	if credential != "" {
		dir := getenv("CREDENTIALS_DIRECTORY")
		if dir == "" {
			return "", fmt.Errorf("%s %spassword_credential %q: $CREDENTIALS_DIRECTORY is not set (LoadCredential= in the unit sets it)", kind, prefix, credential)
		}
		path, field = filepath.Join(dir, credential), prefix+"password_credential"
	}
	if path == "" {
		return "", nil
	}
	pw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", kind, field, err)
	}
	return strings.TrimRight(string(pw), "\r\n"), nil
}
