"""The configuration version: a row that database triggers change on every write to the bots,
the model table and the history policies (`ConfigurationVersion`)."""

from django.db import migrations, models

WATCHED = ("tasks_bot", "tasks_languagemodel", "dispatch_historypolicy")

# A value never written before: from a sequence on PostgreSQL (never handed out twice, even by
# a transaction that rolls back), 64 random bits on SQLite (which has no sequences).
POSTGRESQL = [
    "CREATE SEQUENCE dispatch_configurationversion_value_seq",
    """
    CREATE FUNCTION dispatch_new_configuration_version() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO dispatch_configurationversion (id, value)
        VALUES (1, nextval('dispatch_configurationversion_value_seq'))
        ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value;
        RETURN NULL;
    END
    $$
    """,
    # Row triggers, so that an UPDATE that changes no row (a bot's learned overhead that is
    # not smaller) changes nothing; TRUNCATE has only statement triggers.
    *(
        f"CREATE TRIGGER {table}_configuration_version AFTER INSERT OR UPDATE OR DELETE "
        f"ON {table} FOR EACH ROW EXECUTE FUNCTION dispatch_new_configuration_version()"
        for table in WATCHED
    ),
    *(
        f"CREATE TRIGGER {table}_configuration_version_truncate AFTER TRUNCATE "
        f"ON {table} FOR EACH STATEMENT EXECUTE FUNCTION dispatch_new_configuration_version()"
        for table in WATCHED
    ),
    "INSERT INTO dispatch_configurationversion (id, value) "
    "VALUES (1, nextval('dispatch_configurationversion_value_seq'))",
]
POSTGRESQL_REVERSE = [
    *(f"DROP TRIGGER {table}_configuration_version ON {table}" for table in WATCHED),
    *(f"DROP TRIGGER {table}_configuration_version_truncate ON {table}" for table in WATCHED),
    "DROP FUNCTION dispatch_new_configuration_version()",
    "DROP SEQUENCE dispatch_configurationversion_value_seq",
]
SQLITE = [
    *(
        f"CREATE TRIGGER {table}_configuration_version_{event.lower()} AFTER {event} "  # noqa: S608
        f"ON {table} BEGIN INSERT OR REPLACE INTO dispatch_configurationversion (id, value) "
        "VALUES (1, random()); END"
        for table in WATCHED
        for event in ("INSERT", "UPDATE", "DELETE")
    ),
    "INSERT INTO dispatch_configurationversion (id, value) VALUES (1, random())",
]
SQLITE_REVERSE = [
    f"DROP TRIGGER {table}_configuration_version_{event.lower()}"
    for table in WATCHED
    for event in ("INSERT", "UPDATE", "DELETE")
]


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        for statement in statements_by_vendor.get(schema_editor.connection.vendor, []):
            schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("dispatch", "0012_summaries"),
        ("tasks", "0024_transcript_part_spans"),
    ]

    operations = [
        migrations.CreateModel(
            name="ConfigurationVersion",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("value", models.BigIntegerField()),
            ],
        ),
        migrations.RunPython(
            _run({"postgresql": POSTGRESQL, "sqlite": SQLITE}),
            _run({"postgresql": POSTGRESQL_REVERSE, "sqlite": SQLITE_REVERSE}),
        ),
    ]
