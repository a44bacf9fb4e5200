"""hutch: a message broker that speaks AMQP 0-9-1 and implements RabbitMQ's queue model."""

__version__ = "0.1.0"
