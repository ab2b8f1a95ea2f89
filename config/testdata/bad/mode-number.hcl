socket {
  mode = 660
}
