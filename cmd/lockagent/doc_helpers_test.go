package main

// What the tests of the docs share: the fenced code blocks of a markdown
// file, with the prose around them.

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// repoRoot is the repository, from the package's directory.
var repoRoot = filepath.Join("..", "..")

// mdBlock is a fenced code block of a markdown file.
type mdBlock struct {
	file  string // relative to the repository
	line  int    // of the opening fence, from 1
	end   int    // of the closing fence, from 1
	lang  string // after the opening fence: "hcl", "sh", ""
	lines []string
	// before and after are the paragraphs just before the block and just
	// after it: where a block's needs are said.
	before, after string
}

// where is the block's place, for messages.
func (b mdBlock) where() string { return b.file + ":" + strconv.Itoa(b.line) }

// text is the block's lines as a file.
func (b mdBlock) text() string { return strings.Join(b.lines, "\n") + "\n" }

// mdBlocks returns the fenced code blocks of the markdown file rel (a path
// in the repository), in order. A fence may be indented, as in a list; the
// block's lines lose that indentation.
func mdBlocks(t *testing.T, rel string) []mdBlock {
	t.Helper()
	lines := strings.Split(readDoc(t, rel), "\n")
	var blocks []mdBlock
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimLeft(lines[i], " ")
		if !strings.HasPrefix(trimmed, "```") {
			continue
		}
		indent := len(lines[i]) - len(trimmed)
		b := mdBlock{file: rel, line: i + 1, lang: strings.TrimPrefix(trimmed, "```"), before: paragraph(lines, i-1, -1)}
		for i++; i < len(lines) && strings.TrimLeft(lines[i], " ") != "```"; i++ {
			b.lines = append(b.lines, lines[i][min(indent, len(lines[i])-len(strings.TrimLeft(lines[i], " "))):])
		}
		require.Less(t, i, len(lines), "%s: the block is not closed", b.where())
		b.end = i + 1
		b.after = paragraph(lines, i+1, 1)
		blocks = append(blocks, b)
	}
	return blocks
}

// paragraph is the paragraph that starts at lines[i], going by step (-1:
// backwards), after any blank lines, up to the next blank line or fence.
func paragraph(lines []string, i, step int) string {
	for i >= 0 && i < len(lines) && strings.TrimSpace(lines[i]) == "" {
		i += step
	}
	var par []string
	for ; i >= 0 && i < len(lines) && strings.TrimSpace(lines[i]) != ""; i += step {
		if strings.HasPrefix(strings.TrimSpace(lines[i]), "```") {
			break
		}
		par = append(par, lines[i])
	}
	if step < 0 {
		for l, r := 0, len(par)-1; l < r; l, r = l+1, r-1 {
			par[l], par[r] = par[r], par[l]
		}
	}
	return strings.Join(par, "\n")
}

// docFiles are the markdown files of the docs: the README and docs/*.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	require.NoError(t, err)
	rel := []string{"README.md"}
	for _, f := range files {
		r, err := filepath.Rel(repoRoot, f)
		require.NoError(t, err)
		rel = append(rel, r)
	}
	return rel
}

// readDoc is the text of a file of the repository.
func readDoc(t *testing.T, rel string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot, rel))
	require.NoError(t, err)
	return string(src)
}
