limits {
  max_waiters = "many"
}
