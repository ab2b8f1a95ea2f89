package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testPKI is a CA made for one test, and certificates it signed.
type testPKI struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caFile string
}

func newTestPKI(t *testing.T, dir, name string) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	p := &testPKI{dir: dir, ca: ca, caKey: key, caFile: filepath.Join(dir, name+".pem")}
	writePEM(t, p.caFile, "CERTIFICATE", der)
	return p
}

// issue signs a certificate for 127.0.0.1 (server) or a client, and
// returns its certificate and key files.
func (p *testPKI) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600))
}

// startTLSRedis runs a redis-server that speaks TLS only, wants a client
// certificate signed by the CA and a password, and stops it at the end.
func startTLSRedis(t *testing.T, p *testPKI, password string) string {
	t.Helper()
	cert, key := p.issue(t, "redis", x509.ExtKeyUsageServerAuth)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("redis-server", "--port", "0", "--tls-port", port, "--bind", "127.0.0.1",
		"--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", p.caFile, "--tls-auth-clients", "yes",
		"--requirepass", password, "--save", "", "--appendonly", "no", "--dir", p.dir)
	out := new(syncBuffer)
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("redis-server:\n%s", out)
		}
	})
	eventually(t, exitTimeout, "redis-server listens", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}

// TestRedisTLSAndCredentials: the agent reaches a TLS-only Redis that wants
// a client certificate and a password, with certificates made by the test
// and the password from a systemd credential or a file; the password never
// shows in the logs or in config check. A wrong CA, a missing client
// certificate or a wrong password stop the agent at start.
func TestRedisTLSAndCredentials(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t)
	p := newTestPKI(t, e.dir, "ca")
	password := fmt.Sprintf("pw-%d-never-logged", time.Now().UnixNano())
	addr := startTLSRedis(t, p, password)
	clientCert, clientKey := p.issue(t, "agent", x509.ExtKeyUsageClientAuth)
	creds := filepath.Join(e.dir, "creds")
	require.NoError(t, os.Mkdir(creds, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(creds, "redis-password"), []byte(password+"\n"), 0o600))
	pwFile := filepath.Join(e.dir, "redis.password")
	require.NoError(t, os.WriteFile(pwFile, []byte(password), 0o600))

	backend := func(secret, tls string) string {
		return fmt.Sprintf("backend \"redis\" {\n  addresses = [%q]\n  key_prefix = \"tls%d\"\n  %s\n  tls {\n%s  }\n}\n", addr, time.Now().UnixNano(), secret, tls)
	}
	goodTLS := fmt.Sprintf("    ca_file = %q\n    cert_file = %q\n    key_file = %q\n", p.caFile, clientCert, clientKey)
	credEnv := "CREDENTIALS_DIRECTORY=" + creds

	for _, secret := range []string{`password_credential = "redis-password"`, fmt.Sprintf("password_file = %q", pwFile)} {
		e.writeConfig(t, backend(secret, goodTLS))
		r := lockagent(t, []string{credEnv}, "config", "check", "-config", e.config)
		requireCode(t, 0, r, "config check")
		require.NotContains(t, r.stdout+r.stderr, password)
		a := e.start(t, credEnv)
		c := dialAgent(t, e.socket, "e2e-tls")
		l := mustAcquire(t, c, "tls/1", nil)
		require.NotZero(t, l.Token)
		var chk struct {
			Held bool `json:"held"`
		}
		call(t, c, "check", map[string]any{"lease": l.Lease}, &chk)
		require.True(t, chk.Held, "the lease is in Redis")
		stopAgent(t, a)
		require.Contains(t, a.stderr.String(), "backend=redis")
		require.NotContains(t, a.stderr.String(), password, "the password is never logged")
	}

	other := newTestPKI(t, e.dir, "other-ca")
	wrongPW := filepath.Join(e.dir, "wrong.password")
	require.NoError(t, os.WriteFile(wrongPW, []byte("not-"+password), 0o600))
	for _, tc := range []struct{ name, secret, tls, msg string }{
		{"a CA that did not sign the server", `password_credential = "redis-password"`,
			fmt.Sprintf("    ca_file = %q\n    cert_file = %q\n    key_file = %q\n", other.caFile, clientCert, clientKey), "certificate"},
		{"no client certificate", `password_credential = "redis-password"`, fmt.Sprintf("    ca_file = %q\n", p.caFile), "certificate"},
		{"a wrong password", fmt.Sprintf("password_file = %q", wrongPW), goodTLS, "wrongpass"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.writeConfig(t, backend(tc.secret, tc.tls))
			a := e.spawn(t, credEnv)
			require.Equal(t, 1, a.wait(t, 2*exitTimeout), "the agent's exit status")
			require.Contains(t, strings.ToLower(a.stderr.String()), tc.msg)
			require.NotContains(t, a.stderr.String(), password)
		})
	}

	e.writeConfig(t, backend(`password_credential = "redis-password"`, goodTLS))
	a := e.spawn(t)
	require.Equal(t, 1, a.wait(t, exitTimeout), "without $CREDENTIALS_DIRECTORY")
	require.Contains(t, a.stderr.String(), "CREDENTIALS_DIRECTORY")
}
