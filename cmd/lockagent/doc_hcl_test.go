package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/internal/testkit"
)

// TestDocHCL: every HCL example of the docs (the README, docs/*.md) and the
// packaged config file passes `config check`, as it is and with each of
// its commented-out backend blocks in place of the active one. What an
// example needs of the host, groups and systemd credentials, the doc says
// next to it, and the test provides: config check refuses the example
// without it, as the agent would, and passes with it.
func TestDocHCL(t *testing.T) {
	t.Parallel()
	testkit.SkipShort(t, "the lockagent binary")
	type example struct {
		where, text string
		near        string // the prose that must tell what it needs
	}
	var examples []example
	for _, f := range docFiles(t) {
		for _, b := range mdBlocks(t, f) {
			if b.lang == "hcl" {
				examples = append(examples, example{b.where(), b.text(), b.before + "\n" + b.after})
			}
		}
	}
	pkg, err := os.ReadFile(filepath.Join(repoRoot, "packaging", "lockagent.hcl"))
	require.NoError(t, err)
	// The packaged file says it in its comments, one prose of them.
	comments := regexp.MustCompile(`\n#?\s*`).ReplaceAllString(string(pkg), " ")
	examples = append(examples, example{"packaging/lockagent.hcl", string(pkg), comments})
	// The finder must find them: the config reference, Redis, etcd,
	// metrics, the README's two backends, the packaged file.
	require.GreaterOrEqual(t, len(examples), 7, "the HCL examples found")

	dir, err := os.MkdirTemp("", "la")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	for i, ex := range examples {
		for j, v := range hclVariants(ex.text) {
			what := ex.where
			if j > 0 {
				what += fmt.Sprintf(" (with its commented-out %s)", v.backend)
			}
			file := filepath.Join(dir, fmt.Sprintf("%d-%d.hcl", i, j))
			require.NoError(t, os.WriteFile(file, []byte(v.text), 0o644))
			groups, creds := hostNeeds(t, what, v.text)
			for _, g := range groups {
				require.True(t, mentions(ex.near, g), "%s needs the group %s, and the doc does not say so next to it", what, g)
			}
			for _, c := range creds {
				require.True(t, mentions(ex.near, c) && strings.Contains(ex.near, "CREDENTIALS_DIRECTORY"),
					"%s needs the credential %s in $CREDENTIALS_DIRECTORY, and the doc does not say so next to it", what, c)
			}
			if len(groups) == 0 && len(creds) == 0 {
				r := lockagent(t, nil, "config", "check", "-config", file)
				requireCode(t, 0, r, "config check of "+what)
				continue
			}

			creddir := filepath.Join(dir, fmt.Sprintf("creds-%d-%d", i, j))
			require.NoError(t, os.Mkdir(creddir, 0o755))
			for _, c := range creds {
				require.NoError(t, os.WriteFile(filepath.Join(creddir, c), []byte("password\n"), 0o644))
			}
			withCreds := []string{"CREDENTIALS_DIRECTORY=" + creddir}

			// Without one of the things it needs, config check refuses it,
			// saying why.
			if len(groups) > 0 {
				r := configCheckWithGroups(t, dir, file, groups, false, withCreds)
				requireCode(t, 1, r, "config check of "+what+" on a host without its groups")
				for _, g := range groups {
					require.Contains(t, r.stderr, fmt.Sprintf("unknown group %q", g), what)
				}
			}
			if len(creds) > 0 {
				r := configCheckWithGroups(t, dir, file, groups, true, nil)
				requireCode(t, 1, r, "config check of "+what+" without $CREDENTIALS_DIRECTORY")
				require.Contains(t, r.stderr, "$CREDENTIALS_DIRECTORY is not set", what)
			}
			// With everything, it passes.
			r := configCheckWithGroups(t, dir, file, groups, true, withCreds)
			requireCode(t, 0, r, "config check of "+what+" on a host with what it needs")
		}
	}
}

// hclVariant is an example as it is, or with one of its commented-out
// backend blocks in place of its active backend.
type hclVariant struct {
	backend string // `backend "redis"`; "" for the example as it is
	text    string
}

var (
	activeBackend    = regexp.MustCompile(`(?m)^backend\s+"\w+"\s*\{\}.*\n`)
	commentedBackend = regexp.MustCompile(`(?m)^# (backend "\w+") \{\n(?:#.*\n)*?# \}\n`)
	commentMark      = regexp.MustCompile(`(?m)^# ?`)
)

// hclVariants is the example as it is, then with each of its commented-out
// backend blocks (`# backend "redis" {` to `# }`) in place of the active
// one, as a reader who follows its comments writes it.
func hclVariants(text string) []hclVariant {
	vs := []hclVariant{{"", text}}
	for _, m := range commentedBackend.FindAllStringSubmatchIndex(text, -1) {
		block := commentMark.ReplaceAllString(text[m[0]:m[1]], "")
		v := text[:m[0]] + block + text[m[1]:]
		vs = append(vs, hclVariant{text[m[2]:m[3]], activeBackend.ReplaceAllString(v, "")})
	}
	return vs
}

var (
	groupAttr  = regexp.MustCompile(`(?m)^[^#\n]*?\b(?:group|groups|admin_groups)\s*=\s*(\[[^\]]*\]|"[^"]*")`)
	quoted     = regexp.MustCompile(`"([^"]*)"`)
	credAttr   = regexp.MustCompile(`(?m)^[^#\n]*?\b\w*password_credential\s*=\s*"([^"]+)"`)
	fileAttr   = regexp.MustCompile(`(?m)^[^#\n]*?\b(\w*_file)\s*=\s*"([^"]+)"`)
	numericGID = regexp.MustCompile(`^[0-9]+$`)
)

// hostNeeds is what the example needs of the host: the groups it names (by
// name, not by gid), and the systemd credentials. A file it names is a
// need the test cannot meet: the test fails, so that a doc that starts
// naming one gets the test to provide it.
func hostNeeds(t *testing.T, what, text string) (groups, creds []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, m := range groupAttr.FindAllStringSubmatch(text, -1) {
		for _, g := range quoted.FindAllStringSubmatch(m[1], -1) {
			if g[1] != "" && !numericGID.MatchString(g[1]) && !seen[g[1]] {
				seen[g[1]] = true
				groups = append(groups, g[1])
			}
		}
	}
	for _, m := range credAttr.FindAllStringSubmatch(text, -1) {
		creds = append(creds, m[1])
	}
	for _, m := range fileAttr.FindAllStringSubmatch(text, -1) {
		t.Fatalf("%s: %s names the file %s, which this test does not provide", what, m[1], m[2])
	}
	return groups, creds
}

// mentions tells whether prose names name: in backquotes, or (in a config
// file's comments) as a group or credential.
func mentions(prose, name string) bool {
	q := regexp.QuoteMeta(name)
	return strings.Contains(prose, "`"+name+"`") ||
		regexp.MustCompile(`\b(group|credential) `+q+`\b|\b`+q+` (group|credential)\b`).MatchString(prose)
}

// configCheckWithGroups runs config check of file on a host whose group
// database has the groups (with), or lacks them: the test's own
// /etc/group, bound over the host's in a mount namespace of its own (and a
// user namespace, when the test does not run as root). The host's groups
// are not touched.
func configCheckWithGroups(t *testing.T, dir, file string, groups []string, with bool, extraEnv []string) cliResult {
	t.Helper()
	host, err := os.ReadFile("/etc/group")
	require.NoError(t, err)
	drop := map[string]bool{}
	for _, g := range groups {
		drop[g] = true
	}
	var db strings.Builder
	for _, line := range strings.Split(strings.TrimRight(string(host), "\n"), "\n") {
		if name, _, _ := strings.Cut(line, ":"); !drop[name] {
			db.WriteString(line + "\n")
		}
	}
	if with {
		for i, g := range groups {
			fmt.Fprintf(&db, "%s:x:%d:\n", g, 64000+i)
		}
	}
	f, err := os.CreateTemp(dir, "group")
	require.NoError(t, err)
	_, err = f.WriteString(db.String())
	require.NoError(t, errors.Join(err, f.Chmod(0o644), f.Close()))

	args := []string{"--mount"}
	if os.Geteuid() != 0 {
		args = append(args, "--map-root-user")
	}
	args = append(args, "sh", "-c", `mount --bind "$0" /etc/group && exec "$1" config check -config "$2"`,
		f.Name(), lockagentBin, file)
	ctx, cancel := context.WithTimeout(context.Background(), exitTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "unshare", args...)
	cmd.Env = append(baseEnv(), extraEnv...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		require.NoError(t, err, "unshare")
	}
	require.NotContains(t, stderr.String(), "unshare:", "the mount namespace")
	require.NotContains(t, stderr.String(), "mount:", "the bind mount of /etc/group")
	return cliResult{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
}
