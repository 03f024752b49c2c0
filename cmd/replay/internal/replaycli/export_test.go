package replaycli

// SetAfterList sets a function that Redrive runs between its list and its
// first publish, until the returned reset is called.
func SetAfterList(f func()) (reset func()) {
	afterList = f
	return func() { afterList = nil }
}
