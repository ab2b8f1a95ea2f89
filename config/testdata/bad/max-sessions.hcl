limits {
  max_sessions = 0
}
