module github.com/exactly-go/exactly/tools

go 1.25.0

require (
	github.com/exactly-go/exactly v0.1.0-rc.1
	github.com/exactly-go/exactly/embedpg v0.1.0-rc.1
	github.com/google/uuid v1.6.0
	github.com/jackc/pgx/v5 v5.12.0
	golang.org/x/tools v0.48.0
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/mfridman/interpolate v0.0.2 // indirect
	github.com/pressly/goose/v3 v3.27.0 // indirect
	github.com/sethvargo/go-retry v0.5.0 // indirect
	github.com/ulikunitz/xz v0.5.15 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	golang.org/x/mod v0.38.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)
