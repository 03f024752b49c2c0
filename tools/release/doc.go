// Package release holds the tools of make release-check and make api: a
// module of its own, never published, so that golang.org/x/mod stays out of
// the library's go.mod.
package release
