package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// TestDocLinks: every link of the docs (the README, docs/*.md, the
// clients' READMEs) to a file of the repository names one that exists, and
// a #fragment names a heading of it.
func TestDocLinks(t *testing.T) {
	t.Parallel()
	files := append(docFiles(t), "examples/python/README.md", "examples/node/README.md")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, f := range files {
		src := readDoc(t, f)
		for _, m := range link.FindAllStringSubmatch(src, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			rel := f
			if path != "" {
				rel = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(filepath.Join(repoRoot, rel)); err != nil {
					t.Errorf("%s links to %s, which does not exist", f, target)
					continue
				}
			}
			if frag != "" && !anchors(t, rel)[frag] {
				t.Errorf("%s links to %s, and %s has no heading %q", f, target, rel, frag)
			}
		}
	}
}

// anchors are the fragments that name the headings of a markdown file, as
// GitHub makes them: lower case, spaces as hyphens, other punctuation left
// out.
func anchors(t *testing.T, rel string) map[string]bool {
	t.Helper()
	a := map[string]bool{}
	for _, line := range strings.Split(readDoc(t, rel), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a[b.String()] = true
	}
	return a
}
