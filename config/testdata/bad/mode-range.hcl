socket {
  mode = "1777"
}
