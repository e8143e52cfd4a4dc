"""`select_sources`' two load-balancing choices, each exact to its one-at-a-time definition:

- hosts.py: per atom, the holder host that has sent the least so far (`least_sent_hosts`, by runs);
- devices.py: per multi-holder atom, the least-loaded holder device on that host (`by_steps`,
  hosts' atoms taken together in steps).
"""
