socket {
  path = "agent.sock"
}
