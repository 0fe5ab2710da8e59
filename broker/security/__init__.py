"""Who may talk to a broker, and what they may do: Kafka's security model.

* ``listeners``: the listeners a broker serves, each with its security protocol (PLAINTEXT,
  SSL, SASL_PLAINTEXT, SASL_SSL), and which of them brokers use between themselves.
* ``tls``: SSL contexts from PEM files (server, client, mutual TLS), and a certificate's
  subject as a principal.
* ``sasl``: the server side of SaslHandshake/SaslAuthenticate (PLAIN, SCRAM-SHA-256/512) as a
  sans-IO state machine, and the client side the SDK and the brokers use.
* ``credentials``: SCRAM credentials (salted and hashed), as stored in ZooKeeper.
* ``acls`` / ``authorizer``: ACL bindings, their matching rules and the authorizer that
  serves them from ZooKeeper.
* ``quotas``: byte-rate and request-percentage quotas per user and client id.
"""
