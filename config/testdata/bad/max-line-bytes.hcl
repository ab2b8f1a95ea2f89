limits {
  max_line_bytes = 100
}
