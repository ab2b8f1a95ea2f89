socket {
  group = "no-such-group-for-lockagent"
}
