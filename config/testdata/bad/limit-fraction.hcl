limits {
  max_waiters = 10.5
}
