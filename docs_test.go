package idemq_test

import (
	"io/fs"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// modulePath is the root module's import path: a package path named in the
// docs is checked as the folder under it.
const modulePath = "github.com/idemq/idemq"

// docs are the files a user reads: the README, the guides under docs/ and
// the examples' READMEs.
func docs(t *testing.T, root fs.FS) []string {
	t.Helper()
	var files []string
	err := fs.WalkDir(root, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != "." && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return fs.SkipDir
			}
			return nil
		}
		switch {
		case p == "README.md",
			strings.HasPrefix(p, "docs/") && strings.HasSuffix(p, ".md"),
			strings.HasPrefix(p, "examples/") && strings.HasPrefix(path.Base(p), "README"):
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

var (
	// mdLink is an inline Markdown link or image, [text](target "title"),
	// or a link reference definition, [label]: target.
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)|(?m)^\s{0,3}\[[^\]]+\]:\s*(\S+)`)
	// codeSpan is text in backticks on one line.
	codeSpan = regexp.MustCompile("`([^`\n]+)`")
	// pathLike is a slash-separated path of plain names, as a code span
	// naming a file or folder of the repository is.
	pathLike = regexp.MustCompile(`^(?:\./)?[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+/?$`)
	// symbol is an exported Go name after a package's folder.
	symbol = regexp.MustCompile(`\.[A-Z][A-Za-z0-9_]*(?:\.[A-Z][A-Za-z0-9_]*)?$`)
	// heading is a Markdown ATX heading.
	heading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
	fence   = regexp.MustCompile("(?ms)^```.*?^```")
)

// TestDocsLinksAndPathsExist: every relative link in the docs (README.md,
// docs/, the examples' READMEs) reaches a file or folder of the repository,
// and its #anchor a heading of the linked Markdown file; every repository
// path the docs name in backticks (examples/deploy/relay.json, cmd/idemq,
// transports/webhook.Receiver, github.com/idemq/idemq/otelidemq) exists. A path whose first part is
// neither at the root nor beside the document (an import path of another
// module, a path on the user's machine) is not checked.
func TestDocsLinksAndPathsExist(t *testing.T) {
	t.Parallel()
	root := os.DirFS(".")
	files := docs(t, root)
	if len(files) == 0 {
		t.Fatal("no documents found")
	}
	exists := func(p string) bool {
		_, err := fs.Stat(root, path.Clean(p))
		return err == nil
	}
	for _, file := range files {
		b, err := fs.ReadFile(root, file)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		dir := path.Dir(file)
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1] + m[2]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file0, anchor, _ := strings.Cut(target, "#")
			linked := file
			if file0 != "" {
				linked = path.Join(dir, file0)
				if !exists(linked) {
					t.Errorf("%s: link %q: %s does not exist", file, target, linked)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(linked, ".md") && !hasAnchor(t, root, linked, anchor) {
				t.Errorf("%s: link %q: %s has no heading with the anchor #%s", file, target, linked, anchor)
			}
		}
		for _, m := range codeSpan.FindAllStringSubmatch(text, -1) {
			p, pkg, ok := repoPath(m[1])
			if !ok {
				continue
			}
			first, _, _ := strings.Cut(strings.TrimPrefix(p, "./"), "/")
			switch {
			case pkg:
				if !exists(p) {
					t.Errorf("%s: names package %q, and its folder %s does not exist", file, m[1], p)
				}
			case exists(path.Join(dir, first)):
				if !exists(path.Join(dir, p)) {
					t.Errorf("%s: names %q, and %s does not exist", file, m[1], path.Join(dir, p))
				}
			case exists(first):
				if !exists(p) {
					t.Errorf("%s: names %q, and %s does not exist", file, m[1], p)
				}
			}
		}
	}
}

// repoPath returns the repository path a code span names, if it looks like
// one; pkg reports a package path of this module, which becomes its folder
// (a trailing .Symbol dropped).
func repoPath(span string) (p string, pkg, ok bool) {
	if rest, ok := strings.CutPrefix(span, modulePath); ok && (rest == "" || rest[0] == '/' || rest[0] == '.') {
		rest = strings.TrimPrefix(rest, "/")
		i := strings.LastIndex(rest, "/")
		if j := strings.Index(rest[i+1:], "."); j >= 0 {
			rest = rest[:i+1+j]
		}
		if rest == "" {
			return ".", true, true
		}
		return rest, true, true
	}
	if !pathLike.MatchString(span) || strings.Contains(span, "...") {
		return "", false, false
	}
	// transports/webhook.Receiver: a folder and an exported symbol.
	return symbol.ReplaceAllString(span, ""), false, true
}

// hasAnchor reports whether the Markdown file has a heading whose GitHub
// anchor is anchor.
func hasAnchor(t *testing.T, root fs.FS, file, anchor string) bool {
	t.Helper()
	b, err := fs.ReadFile(root, file)
	if err != nil {
		t.Fatal(err)
	}
	text := fence.ReplaceAllString(string(b), "")
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(text, -1) {
		slug := slugify(m[1])
		n := seen[slug]
		seen[slug]++
		if n > 0 {
			slug += "-" + strconv.Itoa(n)
		}
		if slug == anchor {
			return true
		}
	}
	return false
}

// slugify is GitHub's heading anchor: lower case, markup and punctuation
// but hyphens and underscores dropped, spaces made hyphens.
func slugify(h string) string {
	h = strings.NewReplacer("`", "", "*", "").Replace(strings.ToLower(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}
